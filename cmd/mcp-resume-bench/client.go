package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// client speaks Streamable HTTP by hand (like tests/e2e's raw client), with
// a connection pool large enough for every concurrent stream.
type client struct {
	hc     *http.Client
	nextID atomic.Int64
}

func newClient() *client {
	return &client{hc: &http.Client{Transport: &http.Transport{
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 512,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
	}}}
}

func (c *client) request(ctx context.Context, method, url, sid, body string, extra map[string]string) (*http.Response, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return nil, err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
	} else {
		req.Header.Set("Accept", "text/event-stream")
	}
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
		req.Header.Set("Mcp-Protocol-Version", protocolVersion)
	}
	for k, v := range extra {
		req.Header.Set(k, v)
	}
	return c.hc.Do(req)
}

// initialize opens a session on base and sends notifications/initialized.
func (c *client) initialize(ctx context.Context, base string) (string, error) {
	resp, err := c.request(ctx, http.MethodPost, base+"/mcp", "",
		`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"`+protocolVersion+
			`","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}}`, nil)
	if err != nil {
		return "", err
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	sid := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != http.StatusOK || sid == "" {
		return "", fmt.Errorf("initialize: %d %s", resp.StatusCode, b)
	}
	resp, err = c.request(ctx, http.MethodPost, base+"/mcp", sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, nil)
	if err != nil {
		return "", err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		return "", fmt.Errorf("notifications/initialized: %d", resp.StatusCode)
	}
	return sid, nil
}

// call starts the benchmark tool and returns its open SSE response.
func (c *client) call(ctx context.Context, base, sid string, a callArgs) (*http.Response, error) {
	args, _ := json.Marshal(a)
	id := c.nextID.Add(1)
	resp, err := c.request(ctx, http.MethodPost, base+"/mcp", sid,
		fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"stream","arguments":%s}}`, id, args), nil)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return nil, fmt.Errorf("tools/call: %d %s %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	return resp, nil
}

// resume sends GET with Last-Event-ID.
func (c *client) resume(ctx context.Context, base, sid, lastID string) (*http.Response, error) {
	resp, err := c.request(ctx, http.MethodGet, base+"/mcp", sid, "", map[string]string{"Last-Event-ID": lastID})
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return nil, fmt.Errorf("resume: %d %s", resp.StatusCode, b)
	}
	return resp, nil
}

func (c *client) deleteSession(ctx context.Context, base, sid string) error {
	resp, err := c.request(ctx, http.MethodDelete, base+"/mcp", sid, "", nil)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("DELETE: %d", resp.StatusCode)
	}
	return nil
}

// parallel runs f(i) for i in [0,n) on up to workers goroutines and returns
// the first error.
func parallel(n, workers int, f func(i int) error) error {
	var (
		next  atomic.Int64
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	for w := 0; w < min(workers, n); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					once.Do(func() { first = err })
					next.Store(int64(n)) // stop handing out work
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}

func (c *client) openSessions(ctx context.Context, base string, n, workers int) ([]string, error) {
	sids := make([]string, n)
	err := parallel(n, workers, func(i int) error {
		sid, err := c.initialize(ctx, base)
		sids[i] = sid
		return err
	})
	return sids, err
}

func (c *client) closeSessions(ctx context.Context, base string, sids []string, workers int) error {
	return parallel(len(sids), workers, func(i int) error {
		if sids[i] == "" {
			return nil
		}
		return c.deleteSession(ctx, base, sids[i])
	})
}
