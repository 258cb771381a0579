package sse

import (
	"bytes"
	"reflect"
	"testing"
)

// canonical is what a proxy stores for an event: AppendFields without retry.
func canonical(e *Event) []byte {
	c := *e
	c.HasRetry = false
	return AppendFields(nil, &c)
}

// rawOf parses in as one chunk and returns each event's Raw ("<nil>" if none).
func rawOf(t *testing.T, in string) []string {
	t.Helper()
	var p Parser
	var out []string
	err := p.Feed([]byte(in), func(e *Event) error {
		if e.Raw == nil {
			out = append(out, "<nil>")
		} else {
			out = append(out, string(e.Raw))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestRaw(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"data: a\n\n", []string{"data: a\n"}},
		{"event: message\ndata: {}\n\n", []string{"event: message\ndata: {}\n"}},
		{"data: a\ndata: b\n\n", []string{"data: a\ndata: b\n"}},
		{"id: 7\nretry: 10\nevent: m\ndata: x\n\n", []string{"event: m\ndata: x\n"}}, // before the fields: not part of them
		{": hi\ndata: x\n\n", []string{"data: x\n"}},
		{"data: \n\n", []string{"data: \n"}},
		{"data: a\ndata: b\n\ndata: c\n\n", []string{"data: a\ndata: b\n", "data: c\n"}},
		// Not as AppendFields writes them:
		{"data:a\n\n", []string{"<nil>"}},
		{"data:\n\n", []string{"<nil>"}},
		{"data\n\n", []string{"<nil>"}},
		{"event:m\ndata: x\n\n", []string{"<nil>"}},
		{"data: x\nevent: m\n\n", []string{"<nil>"}},
		{"event: a\nevent: b\ndata: x\n\n", []string{"<nil>"}},
		{"event: m\nid: 1\ndata: x\n\n", []string{"<nil>"}},
		{"data: x\nretry: 5\n\n", []string{"<nil>"}},
		{"data: x\n: comment\ndata: y\n\n", []string{"<nil>"}},
		{"data: x\nfoo: bar\n\n", []string{"<nil>"}},
		{"data: x\r\n\r\n", []string{"<nil>"}},
		{"data: x\rdata: y\n\n", []string{"<nil>"}},
		{"\xEF\xBB\xBFdata: x\n\n", []string{"<nil>"}},  // the BOM is not the event's
		{"event: \ndata: x\n\n", []string{"data: x\n"}}, // an empty type writes nothing
		{"event: t\n\n", []string{"<nil>"}},             // no data
		{"data: a\n\ndata:b\n\ndata: c\n\n", []string{"data: a\n", "<nil>", "data: c\n"}},
	} {
		if got := rawOf(t, tc.in); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%q: Raw %q, want %q", tc.in, got, tc.want)
		}
	}
}

// An event split across chunks has no Raw form (it is not contiguous in one
// chunk), and its Data does not alias a chunk the caller has reused.
func TestRawAcrossChunks(t *testing.T) {
	var p Parser
	var raws, datas []string
	emit := func(e *Event) error {
		raws = append(raws, string(e.Raw))
		datas = append(datas, string(e.Data))
		return nil
	}
	buf := []byte("data: hello\ndata: ")
	if err := p.Feed(buf, emit); err != nil {
		t.Fatal(err)
	}
	copy(buf, "XXXXXXXXXXXXXXXXXX") // the caller reuses its buffer
	if err := p.Feed([]byte("world\n\ndata: x\n\n"), emit); err != nil {
		t.Fatal(err)
	}
	if want := []string{"", "data: x\n"}; !reflect.DeepEqual(raws, want) {
		t.Errorf("Raw %q, want %q", raws, want)
	}
	if want := []string{"hello\nworld", "x"}; !reflect.DeepEqual(datas, want) {
		t.Errorf("Data %q, want %q", datas, want)
	}
	// A single data line split across chunks.
	p = Parser{}
	raws, datas = nil, nil
	buf = []byte("data: abc")
	p.Feed(buf, emit)
	copy(buf, "XXXXXXXXX")
	p.Feed([]byte("def\n\n"), emit)
	if want := []string{"abcdef"}; !reflect.DeepEqual(datas, want) || raws[0] != "" {
		t.Errorf("Data %q Raw %q", datas, raws)
	}
}

// FuzzParserRaw: in any chunking, a Raw form is exactly what AppendFields
// writes for the event without its retry; an event AppendFields wrote, fed
// in one chunk, has one; and events do not depend on the caller keeping its
// chunks (each is overwritten once fed).
func FuzzParserRaw(f *testing.F) {
	for _, s := range corpus {
		f.Add([]byte(s), []byte{1, 2, 3})
		f.Add([]byte(s), []byte{200})
	}
	f.Add([]byte("event: message\ndata: {\"jsonrpc\":\"2.0\"}\n\nid: 1\ndata: a\ndata: b\n\n"), []byte{9, 40})
	f.Fuzz(func(t *testing.T, in, cuts []byte) {
		want, wantErr := parseChunks(0, in)
		var got []ev
		p := Parser{}
		emit := func(e *Event) error {
			if e.Raw != nil {
				if c := canonical(e); !bytes.Equal(e.Raw, c) {
					t.Fatalf("%q: Raw %q, AppendFields writes %q", in, e.Raw, c)
				}
			}
			got = append(got, copyEvent(e))
			return nil
		}
		var err error
		rest := in
		for i := 0; len(rest) > 0 && err == nil; i++ {
			n := len(rest)
			if len(cuts) > 0 && cuts[i%len(cuts)] > 0 {
				n = min(int(cuts[i%len(cuts)]), len(rest))
			}
			chunk := append([]byte(nil), rest[:n]...)
			err = p.Feed(chunk, emit)
			for j := range chunk {
				chunk[j] = 'X' // the caller reuses its buffer
			}
			rest = rest[n:]
		}
		if err != wantErr || !reflect.DeepEqual(got, want) {
			t.Fatalf("%q in chunks of %v:\n got %+v, %+v\nwant %+v, %+v", in, cuts, got, err, want, wantErr)
		}
		// Every event with data, written as a proxy stores it and fed whole,
		// comes back with that form as its Raw.
		for _, e := range want {
			if !e.HasData {
				continue
			}
			ce := e.event()
			framed := append(canonical(ce), '\n')
			if r := rawOf(t, string(framed)); len(r) != 1 || r[0] != string(canonical(ce)) {
				t.Fatalf("%q: Raw %q, want %q", framed, r, canonical(ce))
			}
		}
	})
}
