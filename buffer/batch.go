package buffer

import "context"

// Entry is one event for AppendBatch.
type Entry struct {
	Fields  []byte   // SSE fields, without id, as Append takes them
	Answers []string // the request ids it answers (canonical JSON)
}

// BatchAppender is implemented by streams that can append several events in
// one step, as an upstream read that carried several delivers them: the
// memory store's streams take them under one hold of their lock and wake
// their reader once. It is optional: a Stream without it gets Append for
// each event, with the same outcome.
type BatchAppender interface {
	// AppendBatch appends entries in order, each as Append would (framed
	// under the ID it mints, blocking while the log is full). It returns the
	// seq of the last event appended and how many were; an error stops it
	// at entries[n], which was not appended.
	AppendBatch(ctx context.Context, entries []Entry) (last uint64, n int, err error)
}

var _ BatchAppender = (*memStream)(nil)
