package natsstore

import "testing"

func TestPlainAck(t *testing.T) {
	for _, c := range []struct {
		in  string
		seq uint64
		ok  bool
	}{
		{`{"stream":"KV_mcpr_STREAMS","seq":12}`, 12, true},
		{`{"stream":"mcpr_EVENTS","seq":7,"duplicate":true}`, 7, true},
		{`{"stream":"S","domain":"d","seq":3}`, 3, true},
		{`{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 5"},"stream":"S","seq":0}`, 0, false},
		{`{"stream":"S","seq":}`, 0, false},
		{`{"stream":"S"}`, 0, false},
		{`{"seq":4,"stream":"S"}`, 0, false},
		{``, 0, false},
	} {
		seq, ok := plainAck([]byte(c.in))
		if seq != c.seq || ok != c.ok {
			t.Errorf("plainAck(%s) = %d, %v; want %d, %v", c.in, seq, ok, c.seq, c.ok)
		}
	}
}
