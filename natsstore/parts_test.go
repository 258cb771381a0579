package natsstore

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
)

// part is a message of an event stored in parts, as a writer makes it.
func part(subject string, seq uint64, i, n int, total int, data string) *nats.Msg {
	m := nats.NewMsg(subject)
	m.Data = []byte(data)
	m.Header.Set(hdrFirst, strconv.FormatUint(seq, 10))
	m.Header.Set(hdrOff, "0")
	m.Header.Set(hdrPart, strconv.Itoa(i)+"/"+strconv.Itoa(n))
	m.Header.Set(hdrSize, strconv.Itoa(total))
	return m
}

// A reader never hands out part of an event: parts that do not add up (one
// missing) fail the Read as a storage fault; an event left incomplete and
// stored again whole (a writer failed between its parts, the next one
// stored the seq again) is read as stored again.
func TestEventPartsAreNeverHandedOutAlone(t *testing.T) {
	t.Parallel()
	st := openAt(t, []string{testnet.StockNATS(t).ClientURL()})
	ctx := context.Background()
	publish := func(msgs ...*nats.Msg) {
		t.Helper()
		for _, m := range msgs {
			if _, err := st.js.PublishMsg(ctx, m); err != nil {
				t.Fatal(err)
			}
		}
	}
	s, err := st.CreateSession("parts", buffer.SessionMeta{})
	if err != nil {
		t.Fatal(err)
	}
	read := func(str buffer.Stream) (buffer.Batch, error) {
		r, err := str.Attach(1)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return r.Read(rctx, nil, 1<<20, time.Second)
	}

	// Part 2 of 3 missing.
	str, _ := s.NewStream([]string{"1"}, [32]byte{1})
	subj := str.(*stream).subject
	publish(part(subj, 1, 1, 3, 9, "aaa"), part(subj, 1, 3, 3, 9, "ccc"))
	if b, err := read(str); !errors.Is(err, errBadParts) {
		t.Fatalf("a part missing: read %q, %v; want errBadParts", b.Data, err)
	}

	// Abandoned after its first part, then stored whole.
	str2, _ := s.NewStream([]string{"2"}, [32]byte{2})
	subj = str2.(*stream).subject
	whole := "id: x\ndata: whole\n\n"
	m := nats.NewMsg(subj)
	m.Data = []byte(whole)
	m.Header.Set(hdrFirst, "1")
	m.Header.Set(hdrOff, "0")
	publish(part(subj, 1, 1, 2, 40, strings.Repeat("p", 20)), m)
	b, err := read(str2)
	if err != nil || len(b.Data) != 1 || string(b.Data[0]) != whole {
		t.Fatalf("read %q, %v; want the event stored again", b.Data, err)
	}
}
