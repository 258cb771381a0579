package natsstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// publish stores msg as jetstream.PublishMsg does (retrying a moment while
// no stream answers, as a leader change leaves it) and returns its stream
// sequence, reading the acknowledgement without encoding/json: a call's
// record writes and events are acknowledged by a few hundred of these a
// second, and decoding each was the client's largest single cost. What is
// not a plain acknowledgement (an error, anything unexpected) is decoded
// as nats.go would, so errors are the same *jetstream.APIError values.
func (st *Store) publish(ctx context.Context, msg *nats.Msg) (uint64, error) {
	resp, err := st.nc.RequestMsgWithContext(ctx, msg)
	for r := 0; errors.Is(err, nats.ErrNoResponders) && r < jetstream.DefaultPubRetryAttempts; r++ {
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(jetstream.DefaultPubRetryWait):
		}
		resp, err = st.nc.RequestMsgWithContext(ctx, msg)
	}
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return 0, jetstream.ErrNoStreamResponse
	case err != nil:
		return 0, err
	}
	if seq, ok := plainAck(resp.Data); ok {
		return seq, nil
	}
	var ack struct {
		Error  *jetstream.APIError `json:"error"`
		Stream string              `json:"stream"`
		Seq    uint64              `json:"seq"`
	}
	if err := json.Unmarshal(resp.Data, &ack); err != nil {
		return 0, jetstream.ErrInvalidJSAck
	}
	if ack.Error != nil {
		return 0, fmt.Errorf("nats: %w", ack.Error)
	}
	if ack.Stream == "" {
		return 0, jetstream.ErrInvalidJSAck
	}
	return ack.Seq, nil
}

// plainAck reads the sequence of an acknowledgement such as
// {"stream":"S","seq":12} or {"stream":"S","seq":12,"duplicate":true}; ok
// is false for anything else (an error, other fields first).
func plainAck(b []byte) (uint64, bool) {
	if !bytes.HasPrefix(b, []byte(`{"stream":"`)) || bytes.Contains(b, []byte(`"error"`)) {
		return 0, false
	}
	i := bytes.Index(b, []byte(`,"seq":`))
	if i < 0 {
		return 0, false
	}
	b = b[i+len(`,"seq":`):]
	n := 0
	for n < len(b) && b[n] >= '0' && b[n] <= '9' {
		n++
	}
	if n == 0 || n == len(b) || b[n] != ',' && b[n] != '}' {
		return 0, false
	}
	seq, err := strconv.ParseUint(string(b[:n]), 10, 64)
	return seq, err == nil
}

// kvUpdate is KeyValue.Update (compare-and-set at revision rev, 0: the key
// must not exist) through publish, the message tagged tag (if not empty).
func (st *Store) kvUpdate(ctx context.Context, bucket, key string, value []byte, rev uint64, tag string) (uint64, error) {
	msg := &nats.Msg{Subject: "$KV." + bucket + "." + key, Data: value, Header: nats.Header{}}
	msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(rev, 10))
	if tag != "" {
		msg.Header.Set(hdrWriteTag, tag)
	}
	return st.publish(ctx, msg)
}

// hdrWriteTag names an update's attempt (newWriteTag): KV's readers ignore
// it; an update whose acknowledgement was lost looks for it (kvLastTag).
const hdrWriteTag = "Mcp-Resume-Write"

// kvLastTag reads the tag and revision of key's last write (its message in
// the bucket's stream, a deletion's marker included), by a direct get;
// "" and 0 if the bucket holds none.
func (st *Store) kvLastTag(ctx context.Context, bucket, key string) (string, uint64, error) {
	resp, err := st.nc.RequestWithContext(ctx, "$JS.API.DIRECT.GET.KV_"+bucket+".$KV."+bucket+"."+key, nil)
	if err != nil {
		return "", 0, err
	}
	if status := resp.Header.Get("Status"); len(resp.Data) == 0 && status != "" {
		if status == "404" {
			return "", 0, nil
		}
		return "", 0, fmt.Errorf("nats: direct get of %s: %s %s", key, status, resp.Header.Get("Description"))
	}
	seq, err := strconv.ParseUint(resp.Header.Get(jetstream.SequenceHeader), 10, 64)
	if err != nil {
		return "", 0, fmt.Errorf("nats: direct get of %s: no sequence", key)
	}
	return resp.Header.Get(hdrWriteTag), seq, nil
}

// kvCreateTTL is KeyValue.Create of a key never written (compare-and-set
// at revision 0) with a per-key TTL, through publish: a producer lease,
// taken by every call.
func (st *Store) kvCreateTTL(ctx context.Context, bucket, key string, value []byte, ttl time.Duration) (uint64, error) {
	msg := &nats.Msg{Subject: "$KV." + bucket + "." + key, Data: value, Header: nats.Header{}}
	msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "0")
	msg.Header.Set(jetstream.MsgTTLHeader, ttl.String())
	return st.publish(ctx, msg)
}

// kvPurge is KeyValue.Purge of key (if still at revision rev, 0: whatever
// it holds), its marker kept for ttl (0: until purged), through publish: a
// released lease and a retired record, one of each per call.
func (st *Store) kvPurge(ctx context.Context, bucket, key string, rev uint64, ttl time.Duration) (uint64, error) {
	msg := &nats.Msg{Subject: "$KV." + bucket + "." + key, Header: nats.Header{}}
	msg.Header.Set("KV-Operation", "PURGE")
	msg.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	if ttl > 0 {
		msg.Header.Set(jetstream.MsgTTLHeader, ttl.String())
	}
	if rev > 0 {
		msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(rev, 10))
	}
	return st.publish(ctx, msg)
}
