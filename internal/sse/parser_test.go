package sse

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
)

// ev is a comparable copy of an Event (Data does not alias the parser).
type ev struct {
	ID       string
	HasID    bool
	Type     string
	Data     string
	HasData  bool
	Retry    int64
	HasRetry bool
}

func copyEvent(e *Event) ev {
	return ev{ID: e.ID, HasID: e.HasID, Type: e.Type, Data: string(e.Data), HasData: e.HasData, Retry: e.Retry, HasRetry: e.HasRetry}
}

func (e ev) event() *Event {
	return &Event{ID: e.ID, HasID: e.HasID, Type: e.Type, Data: []byte(e.Data), HasData: e.HasData, Retry: e.Retry, HasRetry: e.HasRetry}
}

// parseChunks feeds chunks in order and collects events until the first error.
func parseChunks(max int, chunks ...[]byte) ([]ev, error) {
	p := Parser{MaxEventBytes: max}
	var out []ev
	emit := func(e *Event) error { out = append(out, copyEvent(e)); return nil }
	for _, c := range chunks {
		if err := p.Feed(c, emit); err != nil {
			return out, err
		}
	}
	return out, nil
}

func parseString(s string) ([]ev, error) { return parseChunks(0, []byte(s)) }

func data(s string) ev { return ev{Data: s, HasData: true} }

func TestParser(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []ev
	}{
		{"LF", "data: a\n\n", []ev{data("a")}},
		{"CRLF", "data: a\r\n\r\n", []ev{data("a")}},
		{"CR", "data: a\r\r", []ev{data("a")}},
		{"mixed endings", "data: a\r\ndata: b\rdata: c\n\r\n", []ev{data("a\nb\nc")}},
		{"CR CR is a blank line, not CRLF", "data: a\r\rdata: b\n\n", []ev{data("a"), data("b")}},
		{"LF CR", "data: a\n\rdata: b\n\n", []ev{data("a"), data("b")}},
		{"several events", "data: 1\n\ndata: 2\n\nevent: x\ndata: 3\n\n", []ev{data("1"), data("2"), {Type: "x", Data: "3", HasData: true}}},
		{"no space after colon", "data:a\n\n", []ev{data("a")}},
		{"only one space stripped", "data:  a \n\n", []ev{data(" a ")}},
		{"colon in value", "data: a: b\n\n", []ev{data("a: b")}},
		{"field without colon", "data\n\n", []ev{data("")}},
		{"empty data lines", "data\ndata\n\n", []ev{data("\n")}},
		{"multi-line data", "data: {\ndata:   \"a\": 1\ndata: }\n\n", []ev{data("{\n  \"a\": 1\n}")}},
		{"comments are skipped", ": keep-alive\n\n:\ndata: a\n: inside\ndata: b\n\n", []ev{data("a\nb")}},
		{"comment only is no event", ": hi\n\n: there\r\n\r\n", nil},
		{"blank lines alone are no event", "\n\n\r\n\r\r", nil},
		{"event type", "event: ping\ndata: x\n\n", []ev{{Type: "ping", Data: "x", HasData: true}}},
		{"type resets between events", "event: a\ndata: 1\n\ndata: 2\n\n", []ev{{Type: "a", Data: "1", HasData: true}, data("2")}},
		{"id", "id: 7\ndata: x\n\n", []ev{{ID: "7", HasID: true, Data: "x", HasData: true}}},
		{"empty id", "id\ndata: x\n\n", []ev{{ID: "", HasID: true, Data: "x", HasData: true}}},
		{"id with NUL ignored", "id: a\x00b\ndata: x\n\n", []ev{data("x")}},
		{"id with NUL keeps earlier id", "id: 1\nid: a\x00\ndata: x\n\n", []ev{{ID: "1", HasID: true, Data: "x", HasData: true}}},
		{"last id wins", "id: 1\nid: 2\ndata: x\n\n", []ev{{ID: "2", HasID: true, Data: "x", HasData: true}}},
		{"retry", "retry: 1500\ndata: x\n\n", []ev{{Retry: 1500, HasRetry: true, Data: "x", HasData: true}}},
		{"retry zero", "retry: 0\ndata: x\n\n", []ev{{Retry: 0, HasRetry: true, Data: "x", HasData: true}}},
		{"retry non-digits ignored", "retry: 15s\ndata: x\n\n", []ev{data("x")}},
		{"retry sign ignored", "retry: +15\ndata: x\n\n", []ev{data("x")}},
		{"retry negative ignored", "retry: -1\ndata: x\n\n", []ev{data("x")}},
		{"retry empty ignored", "retry:\ndata: x\n\n", []ev{data("x")}},
		{"retry space inside ignored", "retry: 1 5\ndata: x\n\n", []ev{data("x")}},
		{"retry overflow saturates", "retry: 99999999999999999999999\ndata: x\n\n", []ev{{Retry: math.MaxInt64, HasRetry: true, Data: "x", HasData: true}}},
		{"retry past int64 ms as a duration", "retry: 18446744073710\ndata: x\n\n", []ev{{Retry: 18446744073710, HasRetry: true, Data: "x", HasData: true}}},
		{"unknown field", "foo: bar\ndata: x\n\n", []ev{data("x")}},
		{"field names are case sensitive", "Data: x\nDATA: y\ndata: z\n\n", []ev{data("z")}},
		{"BOM at start", "\xEF\xBB\xBFdata: a\n\n", []ev{data("a")}},
		{"BOM only once", "\xEF\xBB\xBF\xEF\xBB\xBFdata: a\n\ndata: b\n\n", []ev{data("b")}},
		{"BOM later is not stripped", "data: a\n\n\xEF\xBB\xBFdata: b\n\ndata: c\n\n", []ev{data("a"), data("c")}},
		{"unterminated event is not dispatched", "data: a\n\ndata: b\n", []ev{data("a")}},
		{"unterminated line is not processed", "data: a\n\ndata: b", []ev{data("a")}},
		{"NUL and UTF-8 in data", "data: \x00é\n\n", []ev{data("\x00é")}},
		// Events the proxy must see although browsers would not dispatch them.
		{"id only (priming)", "id: p-0\n\n", []ev{{ID: "p-0", HasID: true}}},
		{"priming with empty data", "id: p-0\ndata: \n\n", []ev{{ID: "p-0", HasID: true, HasData: true}}},
		{"retry only", "retry: 10\n\n", []ev{{Retry: 10, HasRetry: true}}},
		// Nothing recognised: nothing to dispatch (and no seq to burn).
		{"unknown fields only", "foo: bar\n\n", nil},
		{"ignored fields only", "id: \x00\nretry: x\nevent:\n\ndata: a\n\n", []ev{data("a")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseString(tt.in)
			if err != nil {
				t.Fatalf("error: %+v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("parse(%q)\n got %+v\nwant %+v", tt.in, got, tt.want)
			}
			// The same in every 2-way split and in 1-byte chunks.
			checkSplits(t, 0, []byte(tt.in))
		})
	}
}

// corpus exercises every line ending, split CRLF, comments, BOM and fields.
var corpus = []string{
	"\xEF\xBB\xBFevent: message\r\nid: 1\r\ndata: {\"jsonrpc\":\"2.0\"}\r\n\r\n: keep-alive\r\n\r\ndata: a\rdata: b\r\rretry: 300\nid\ndata\n\n",
	"data: a\r\n\r\ndata: b\r\r\ndata: c\n\r\n\r",
	": c\n\nid: x\x00y\nid: 42\nevent: e\nretry: 12x\nretry: 99\ndata:1\ndata:  2\n\ndata: tail",
	"\r\r\n\n\r\n\xEF\xBB\xBFdata: not-bom\n\n",
	strings.Repeat("data: 0123456789\r\n", 20) + "\r\n",
	// retry values whose milliseconds overflow a time.Duration, or int64
	"retry: 18446744073710\ndata: x\n\nretry: 99999999999999999999999\n\nretry: 9223372036854775807\ndata: y\n\n",
}

// checkSplits feeds in every 2-way split and in 1-byte chunks and compares
// against the one-shot parse, error included.
func checkSplits(t *testing.T, max int, in []byte) {
	t.Helper()
	want, wantErr := parseChunks(max, in)
	for i := 0; i <= len(in); i++ {
		got, err := parseChunks(max, in[:i], in[i:])
		if !reflect.DeepEqual(got, want) || !errors.Is(err, wantErr) && err != wantErr {
			t.Fatalf("split at %d of %q:\n got %+v, %+v\nwant %+v, %+v", i, in, got, err, want, wantErr)
		}
	}
	chunks := make([][]byte, len(in))
	for i := range in {
		chunks[i] = in[i : i+1]
	}
	got, err := parseChunks(max, chunks...)
	if !reflect.DeepEqual(got, want) || err != wantErr {
		t.Fatalf("1-byte chunks of %q:\n got %+v, %+v\nwant %+v, %+v", in, got, err, want, wantErr)
	}
}

func TestParserSplits(t *testing.T) {
	for _, s := range corpus {
		checkSplits(t, 0, []byte(s))
		// and with a bound that some events in the corpus exceed
		checkSplits(t, 40, []byte(s))
	}
	all := []byte(strings.Join(corpus, "\n\n"))
	checkSplits(t, 0, all)
}

func TestParserCRThenLFAcrossChunks(t *testing.T) {
	// "\r" ends chunk 1 and "\n" starts chunk 2: one line ending, not two.
	got, err := parseChunks(0, []byte("data: a\r"), []byte("\ndata: b\r"), []byte("\n\r"), []byte("\n"))
	if err != nil {
		t.Fatal(err)
	}
	if want := []ev{data("a\nb")}; !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	// "\r" then "\r": two line endings, the second a blank line.
	got, _ = parseChunks(0, []byte("data: a\r"), []byte("\rdata: b\n\n"))
	if want := []ev{data("a"), data("b")}; !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	// "\r" then an empty chunk, then "\n".
	got, _ = parseChunks(0, []byte("data: a\r"), nil, []byte("\n\n"))
	if want := []ev{data("a")}; !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}

func TestParserEmitError(t *testing.T) {
	var p Parser
	stop := errors.New("stop")
	n := 0
	err := p.Feed([]byte("data: 1\n\ndata: 2\n\n"), func(*Event) error { n++; return stop })
	if err != stop || n != 1 {
		t.Fatalf("err=%+v after %d events, want stop after 1", err, n)
	}
}

func TestParserEventTooLarge(t *testing.T) {
	const max = 32
	tests := []struct {
		name    string
		in      string
		want    []ev
		wantErr error
	}{
		{"fits exactly", "data: " + strings.Repeat("x", max-6) + "\n\n", []ev{data(strings.Repeat("x", max-6))}, nil},
		{"one line too long", "data: " + strings.Repeat("x", max-5) + "\n\n", nil, ErrEventTooLarge},
		{"many lines add up", strings.Repeat("data: 0123456789\n", 3) + "\n", nil, ErrEventTooLarge},
		{"bound is per event", strings.Repeat("data: 0123456789\n\n", 10), []ev{data("0123456789"), data("0123456789"), data("0123456789"), data("0123456789"), data("0123456789"), data("0123456789"), data("0123456789"), data("0123456789"), data("0123456789"), data("0123456789")}, nil},
		{"events before the large one are delivered", "data: ok\n\ndata: " + strings.Repeat("x", 100) + "\n\n", []ev{data("ok")}, ErrEventTooLarge},
		{"unterminated long line", "data: " + strings.Repeat("x", 100), nil, ErrEventTooLarge},
		{"unterminated long comment", ":" + strings.Repeat("x", 100), nil, ErrEventTooLarge},
		{"long comment line", ":" + strings.Repeat("x", 100) + "\ndata: a\n\n", nil, ErrEventTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseChunks(max, []byte(tt.in))
			if err != tt.wantErr || !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got %+v, %v; want %+v, %v", got, err, tt.want, tt.wantErr)
			}
			checkSplits(t, max, []byte(tt.in))
		})
	}
}

// TestParserAbsurdLine feeds an endless line: the parser must give up once it
// passes the bound instead of buffering everything.
func TestParserAbsurdLine(t *testing.T) {
	var p Parser // default bound
	chunk := bytes.Repeat([]byte("x"), 64<<10)
	fed := 0
	var err error
	for fed < 64<<20 {
		if err = p.Feed(chunk, func(*Event) error { return nil }); err != nil {
			break
		}
		fed += len(chunk)
	}
	if err != ErrEventTooLarge {
		t.Fatalf("err = %+v after %d bytes, want ErrEventTooLarge", err, fed)
	}
	if fed > DefaultMaxEventBytes {
		t.Fatalf("accepted %d bytes of one line, bound is %d", fed, DefaultMaxEventBytes)
	}
	if cap(p.line) > 2*DefaultMaxEventBytes {
		t.Fatalf("buffered %d bytes", cap(p.line))
	}
}

// reframe writes an event the way the proxy stores and sends it: its id (the
// proxy's, here the original), the stored fields, a blank line.
func reframe(e ev) []byte {
	var b []byte
	if e.HasID {
		b = AppendID(b, e.ID)
	}
	b = AppendFields(b, e.event())
	return append(b, '\n')
}

func empty(e ev) bool { return e == ev{} }

func TestRoundTrip(t *testing.T) {
	events := []ev{
		data("a"),
		data(""),
		data("\n"),
		data("line1\nline2\n\nline4"),
		data(" leading space"),
		data(": looks like a comment"),
		{Type: "gap", Data: `{"lost":3}`, HasData: true},
		{Type: " spaced", Data: "x", HasData: true},
		{Retry: 3000, HasRetry: true, Data: "x", HasData: true},
		{ID: "k3j7x2qa-3-17", HasID: true, Data: "x", HasData: true},
		{ID: " x", HasID: true, Data: "x", HasData: true},
		{ID: "p-0", HasID: true},                // priming without data
		{ID: "p-0", HasID: true, HasData: true}, // priming with empty data
		{Retry: 10, HasRetry: true},             // no data: must not gain one
		{Type: "ping"},                          // no data: must not gain one
		{Type: "e", Retry: 5, HasRetry: true, Data: "d\x00", HasData: true},
	}
	for _, e := range events {
		got, err := parseChunks(0, reframe(e))
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0] != e {
			t.Errorf("round trip of %+v via %q gave %+v", e, reframe(e), got)
		}
	}
	// parse -> reframe -> parse over the corpus
	for _, s := range corpus {
		evs, _ := parseString(s)
		for _, e := range evs {
			got, err := parseChunks(0, reframe(e))
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || got[0] != e {
				t.Errorf("round trip of %+v via %q gave %+v", e, reframe(e), got)
			}
		}
	}
}

func TestFrame(t *testing.T) {
	if got := string(AppendFields(nil, &Event{Type: "t", Retry: 5, HasRetry: true, Data: []byte("a\nb"), HasData: true, ID: "ignored", HasID: true})); got != "event: t\nretry: 5\ndata: a\ndata: b\n" {
		t.Errorf("AppendFields = %q", got)
	}
	if got := string(AppendFields([]byte("x"), &Event{HasData: true})); got != "xdata: \n" {
		t.Errorf("AppendFields(empty data) = %q", got)
	}
	if got := string(AppendData(nil, []byte("a\n"))); got != "data: a\ndata: \n" {
		t.Errorf("AppendData = %q", got)
	}
	if got := string(AppendID(nil, "e-1-2")); got != "id: e-1-2\n" {
		t.Errorf("AppendID = %q", got)
	}
	if got := string(AppendComment(nil, "")); got != ":\n\n" {
		t.Errorf("AppendComment = %q", got)
	}
	if got := string(AppendComment(nil, "keep-alive")); got != ": keep-alive\n\n" {
		t.Errorf("AppendComment = %q", got)
	}
	// A keep-alive is not an event.
	if evs, _ := parseChunks(0, AppendComment(nil, "ka")); len(evs) != 0 {
		t.Errorf("comment parsed as %+v", evs)
	}
}

// FuzzParser: arbitrary input in arbitrary chunkings never panics, gives the
// same events (and error) as a one-shot parse, and every event survives being
// re-framed (AppendID+AppendFields+blank line) and parsed again.
func FuzzParser(f *testing.F) {
	for _, s := range corpus {
		f.Add([]byte(s), []byte{1, 2, 3}, uint8(0))
		f.Add([]byte(s), []byte{7}, uint8(20))
	}
	f.Fuzz(func(t *testing.T, in, cuts []byte, bound uint8) {
		max := int(bound) // 0: the default; otherwise a tiny bound
		want, wantErr := parseChunks(max, in)
		if wantErr != nil && wantErr != ErrEventTooLarge {
			t.Fatalf("unexpected error %+v", wantErr)
		}
		// chunk sizes from cuts (0 means an empty chunk), cycling
		var chunks [][]byte
		rest := in
		for i := 0; len(rest) > 0; i++ {
			n := len(rest)
			if len(cuts) > 0 {
				n = min(int(cuts[i%len(cuts)]), len(rest))
			}
			chunks = append(chunks, rest[:n])
			rest = rest[n:]
			if i > 4*len(in)+4 { // only zero cuts: finish in one chunk
				chunks = append(chunks, rest)
				break
			}
		}
		got, err := parseChunks(max, chunks...)
		if err != wantErr || !reflect.DeepEqual(got, want) {
			t.Fatalf("chunked %q:\n got %+v, %+v\nwant %+v, %+v", chunks, got, err, want, wantErr)
		}
		for _, e := range want {
			if empty(e) {
				t.Fatalf("%q: dispatched an event with no data, id, type or retry", in)
			}
			if strings.ContainsAny(e.Data, "\r") || strings.ContainsAny(e.ID, "\r\n\x00") || strings.ContainsAny(e.Type, "\r\n") {
				t.Fatalf("event %+v holds a line break", e)
			}
			b := reframe(e)
			re, err := parseChunks(0, b)
			if err != nil {
				t.Fatalf("reparse of %q: %+v", b, err)
			}
			if len(re) != 1 || re[0] != e {
				t.Fatalf("event %+v reframed as %q parsed as %+v", e, b, re)
			}
		}
	})
}

func benchmarkParser(b *testing.B, size int) {
	payload := bytes.Repeat([]byte("x"), size)
	var stream []byte
	const perChunk = 16
	for i := 0; i < perChunk; i++ {
		stream = append(stream, "id: 1\nevent: message\ndata: "...)
		stream = append(stream, payload...)
		stream = append(stream, "\n\n"...)
	}
	var p Parser
	n := 0
	emit := func(e *Event) error { n += len(e.Data); return nil }
	b.ReportAllocs()
	b.SetBytes(int64(len(stream) / perChunk))
	b.ResetTimer()
	for i := 0; i < b.N; i += perChunk {
		// feed in network-sized pieces so lines straddle chunk boundaries
		for rest := stream; len(rest) > 0; {
			k := min(len(rest), 1500)
			if err := p.Feed(rest[:k], emit); err != nil {
				b.Fatal(err)
			}
			rest = rest[k:]
		}
	}
	if n == 0 {
		b.Fatal("no events")
	}
}

func BenchmarkParser(b *testing.B) {
	b.Run("100B", func(b *testing.B) { benchmarkParser(b, 100) })
	b.Run("4KiB", func(b *testing.B) { benchmarkParser(b, 4<<10) })
}

// Finish dispatches an event the input ended without its blank line, as
// clients do at EOF, and nothing for a pending event without data.
func TestFinishDispatchesUnterminatedEvent(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"data: x", []string{"x"}},
		{"data: x\n", []string{"x"}},
		{"data: a\ndata: b\r", []string{"a\nb"}},
		{"id: 1\n", nil},
		{"data: done\n\n", []string{"done"}},
		{"", nil},
	} {
		var p Parser
		var got []string
		emit := func(ev *Event) error { got = append(got, string(ev.Data)); return nil }
		if err := p.Feed([]byte(tc.in), emit); err != nil {
			t.Fatal(err)
		}
		if err := p.Finish(emit); err != nil {
			t.Fatal(err)
		}
		if strings.Join(got, "|") != strings.Join(tc.want, "|") {
			t.Errorf("%q: got %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestFieldsLenIsExact(t *testing.T) {
	for _, ev := range []Event{
		{Data: []byte("x"), HasData: true},
		{Data: []byte(""), HasData: true},
		{Data: []byte("a\nb\n\nc"), HasData: true, Type: "message"},
		{Data: []byte("{}"), HasData: true, Retry: 1500, HasRetry: true},
		{Type: "ping"},
	} {
		if got, want := FieldsLen(&ev), len(AppendFields(nil, &ev)); got != want {
			t.Errorf("%+v: FieldsLen %d, AppendFields wrote %d", ev, got, want)
		}
	}
}

// A parser that carried one large event does not keep its size afterwards.
func TestParserGivesLargeBuffersBack(t *testing.T) {
	var p Parser
	p.MaxEventBytes = 8 << 20
	big := "data: " + strings.Repeat("x", 4<<20) + "\n\n"
	n := 0
	if err := p.Feed([]byte(big[:1000]), func(*Event) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	if err := p.Feed([]byte(big[1000:]), func(*Event) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("%d events", n)
	}
	if cap(p.data) > keepBuffer || cap(p.line) > keepBuffer {
		t.Fatalf("the parser keeps %d + %d bytes after a large event", cap(p.data), cap(p.line))
	}
}
