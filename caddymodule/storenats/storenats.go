// Package storenats is the nats module of the mcp_resume.stores namespace
// (mcp_resume.stores.nats): the zone's retention in NATS JetStream, shared
// by replicas and kept across restarts, on package natsstore. It is its own
// package, as Caddy's encoders are, so the Caddy module knows no store but
// the memory one. Files: storenats.go (the module, its Caddyfile, the
// embedded server).
package storenats

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/nats-io/nats-server/v2/server"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/caddymodule"
	"github.com/mcpresume/caddy-mcp-resume/natsstore"
	"github.com/mcpresume/caddy-mcp-resume/resume"
)

func init() {
	caddy.RegisterModule(NATSStore{})
}

// NATSStore keeps retention in NATS JetStream, shared by every Caddy that
// names the same NATS system and zone: a client may resume on any replica,
// and a restart or a rolling deploy loses nothing. natsstore/DESIGN.md says
// where each piece of state lives.
type NATSStore struct {
	// NATS server URLs (nats://host:4222, tls://host:4222). Either urls or
	// embedded.
	URLs []string `json:"urls,omitempty"`

	// Embedded runs a single-node JetStream server inside Caddy, storing in
	// Dir: retention that survives restarts with no other process. Other
	// processes cannot share it.
	Embedded bool `json:"embedded,omitempty"`

	// Storage directory of the embedded server. Default: the "mcp_resume/nats"
	// folder in Caddy's data directory.
	Dir string `json:"dir,omitempty"`

	// Replicas of the zone's JetStream stream and buckets: 1, 3 or 5 (a
	// cluster of at least that many servers). Default: 1.
	Replicas int `json:"replicas,omitempty"`

	// Authentication: a credentials file (NKey/JWT), a token, or a user and
	// password. Placeholders such as {env.NATS_TOKEN} are replaced.
	CredentialsFile string `json:"credentials,omitempty"`
	Token           string `json:"token,omitempty"`
	User            string `json:"user,omitempty"`
	Password        string `json:"password,omitempty"`

	// TLS: the CA that signs the servers' certificates, and a client
	// certificate and key for mutual TLS.
	TLSCA   string `json:"tls_ca,omitempty"`
	TLSCert string `json:"tls_cert,omitempty"`
	TLSKey  string `json:"tls_key,omitempty"`

	// Prefix of the zone's stream, buckets and subjects; proxies of different
	// deployments sharing one NATS system need different prefixes. Default:
	// "mcpr_<zone>".
	Prefix string `json:"prefix,omitempty"`

	// How long a stopping Caddy keeps reading its upstream responses into
	// the store (not taking new calls) before it fails the rest; Caddy
	// exits after it. Default: 20s.
	DrainTimeout caddy.Duration `json:"drain_timeout,omitempty"`

	// How long a producer's lease outlives a replica that died without
	// stopping: after it, another replica fails the dead producer's streams.
	// Default: 15s.
	LeaseTTL caddy.Duration `json:"lease_ttl,omitempty"`

	// How long a call whose replica died waits, once its lease lapsed, for
	// its client to come back (on any replica) so that replica resumes the
	// upstream from the stream's recorded upstream event ID; after it, the
	// call fails explicitly. Only upstreams that give event IDs can be
	// resumed; the others' calls fail at lease_ttl. Default: 1m.
	TakeoverWait caddy.Duration `json:"takeover_wait,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (NATSStore) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "mcp_resume.stores.nats",
		New: func() caddy.Module { return new(NATSStore) },
	}
}

var natsPrefixRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,32}$`)

// Validate checks the configuration; errors name the option.
func (n *NATSStore) Validate() error {
	auth := 0
	for _, set := range []bool{n.CredentialsFile != "", n.Token != "", n.User != ""} {
		if set {
			auth++
		}
	}
	switch {
	case n.Embedded && len(n.URLs) > 0:
		return fmt.Errorf("store nats: use either url or embedded, not both")
	case !n.Embedded && len(n.URLs) == 0:
		return fmt.Errorf("store nats: needs url <nats://host:port...> or embedded [<dir>]")
	case n.Replicas != 0 && n.Replicas != 1 && n.Replicas != 3 && n.Replicas != 5:
		return fmt.Errorf("store nats: replicas (%d) must be 1, 3 or 5", n.Replicas)
	case n.Embedded && n.Replicas > 1:
		return fmt.Errorf("store nats: replicas (%d) needs a NATS cluster; the embedded server is a single node", n.Replicas)
	case auth > 1:
		return fmt.Errorf("store nats: use one of credentials, token, or user")
	case n.User == "" && n.Password != "":
		return fmt.Errorf("store nats: password without user")
	case (n.TLSCert == "") != (n.TLSKey == ""):
		return fmt.Errorf("store nats: tls_client needs both a certificate and a key")
	case n.Prefix != "" && !natsPrefixRE.MatchString(n.Prefix):
		return fmt.Errorf("store nats: prefix %q: use 1 to 32 letters, digits, '_' or '-'", n.Prefix)
	case n.DrainTimeout < 0 || n.LeaseTTL < 0 || n.TakeoverWait < 0:
		return fmt.Errorf("store nats: durations must be positive")
	case n.LeaseTTL != 0 && time.Duration(n.LeaseTTL) < time.Second:
		return fmt.Errorf("store nats: lease_ttl (%s) must be at least 1s", time.Duration(n.LeaseTTL))
	}
	for _, u := range n.URLs {
		if !strings.Contains(u, "://") {
			return fmt.Errorf("store nats: url %q: expected nats://host:port (or tls://, ws://)", u)
		}
	}
	return nil
}

// OpenStore implements caddymodule.StoreModule.
func (n NATSStore) OpenStore(ctx context.Context, zone string, o caddymodule.StoreOptions) (buffer.Backend, error) {
	repl := caddy.NewReplacer()
	prefix := n.Prefix
	if prefix == "" {
		prefix = "mcpr_" + zone
	}
	urls := make([]string, len(n.URLs))
	for i, u := range n.URLs {
		urls[i] = repl.ReplaceKnown(u, "")
	}
	var srv *embeddedServer
	if n.Embedded {
		var err error
		if srv, err = loadEmbedded(n.embeddedDir()); err != nil {
			return nil, err
		}
	}
	var once sync.Once
	release := func() {
		if srv != nil {
			once.Do(func() { embeddedServers.Delete(srv.dir) })
		}
	}
	opts := natsstore.Options{
		URLs:            urls,
		Replicas:        n.Replicas,
		CredentialsFile: repl.ReplaceKnown(n.CredentialsFile, ""),
		Token:           repl.ReplaceKnown(n.Token, ""),
		User:            repl.ReplaceKnown(n.User, ""),
		Password:        repl.ReplaceKnown(n.Password, ""),
		TLSCAFile:       repl.ReplaceKnown(n.TLSCA, ""),
		TLSCertFile:     repl.ReplaceKnown(n.TLSCert, ""),
		TLSKeyFile:      repl.ReplaceKnown(n.TLSKey, ""),
		Prefix:          prefix,
		Limits:          o.Limits,
		Hooks:           o.Hooks,
		LeaseTTL:        time.Duration(n.LeaseTTL),
		TakeoverWait:    time.Duration(n.TakeoverWait),
		FailureSignals:  resume.FailureSignals,
		OnError:         o.OnError,
		OnPublish:       o.OnPublish,
		OnDataLost: func(l natsstore.DataLoss) {
			if o.OnDataLost != nil {
				o.OnDataLost(caddymodule.DataLoss{Missing: l.Missing, Sessions: l.Sessions, Events: l.Events,
					SecretChanged: l.SecretChanged})
			}
		},
	}
	if srv != nil {
		opts.Server = srv.Server
	}
	st, err := natsstore.Open(ctx, opts)
	if err != nil {
		release()
		return nil, err
	}
	// An event larger than one NATS message (max_payload) is stored in
	// parts: max_event_bytes needs no room in max_payload.
	if srv != nil {
		return &embeddedStore{Store: st, release: release}, nil
	}
	return st, nil
}

// embeddedServers are the embedded JetStream servers by storage directory:
// zones that name the same directory share one (each under its own
// prefix), since two servers cannot share a directory.
var embeddedServers = caddy.NewUsagePool()

type embeddedServer struct {
	*server.Server
	dir string
}

// Destruct implements caddy.Destructor.
func (e *embeddedServer) Destruct() error {
	e.Shutdown()
	e.WaitForShutdown()
	return nil
}

func loadEmbedded(dir string) (*embeddedServer, error) {
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	v, _, err := embeddedServers.LoadOrNew(dir, func() (caddy.Destructor, error) {
		srv, err := natsstore.StartEmbedded(dir, false)
		if err != nil {
			return nil, err
		}
		return &embeddedServer{Server: srv, dir: dir}, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*embeddedServer), nil
}

// embeddedStore is a store on an embedded server: closing it lets the
// server go once no zone uses it.
type embeddedStore struct {
	*natsstore.Store
	release func()
}

// Close implements buffer.Store.
func (s *embeddedStore) Close() {
	s.Store.Close()
	s.release()
}

// Shared implements caddymodule.StoreModule.
func (NATSStore) Shared() bool { return true }

// Identity implements caddymodule.StoreModule: the configuration with its defaults
// filled in, without drain_timeout (a reload applies it to the running
// zone).
func (n NATSStore) Identity(zone string) string {
	n.DrainTimeout = 0
	n.Replicas = max(n.Replicas, 1)
	if n.Prefix == "" {
		n.Prefix = "mcpr_" + zone
	}
	if n.LeaseTTL == 0 {
		n.LeaseTTL = caddy.Duration(natsstore.DefaultLeaseTTL)
	}
	if n.TakeoverWait == 0 {
		n.TakeoverWait = caddy.Duration(natsstore.DefaultTakeoverWait)
	}
	if n.Embedded {
		n.Dir = n.embeddedDir()
	}
	b, _ := json.Marshal(n)
	return "nats" + string(b)
}

// embeddedDir is the embedded server's storage directory, absolute.
func (n NATSStore) embeddedDir() string {
	dir := caddy.NewReplacer().ReplaceKnown(n.Dir, "")
	if dir == "" {
		dir = filepath.Join(caddy.AppDataDir(), "mcp_resume", "nats")
	}
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	return dir
}

// DrainFor implements caddymodule.Drainer: how long a stopping Caddy
// drains into the store.
func (n NATSStore) DrainFor() time.Duration {
	if n.DrainTimeout > 0 {
		return time.Duration(n.DrainTimeout)
	}
	return caddymodule.DefaultDrainTimeout
}

// UnmarshalCaddyfile implements caddyfile.Unmarshaler. Syntax:
//
//	store nats {
//	    url           <nats://host:port...>
//	    embedded      [<dir>]
//	    replicas      <1|3|5>
//	    credentials   <file>
//	    token         <token>
//	    user          <user> <password>
//	    tls_ca        <file>
//	    tls_client    <cert file> <key file>
//	    prefix        <name>
//	    drain_timeout <duration>
//	    lease_ttl     <duration>
//	    takeover_wait <duration>
//	}
func (n *NATSStore) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // "nats"
	if d.NextArg() {
		return d.Errf("store nats: options go in a block, e.g. store nats { url nats://127.0.0.1:4222 }")
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		args := d.RemainingArgs()
		one := func(dst *string, example string) error {
			if len(args) != 1 {
				return d.Errf("store nats: %s: expected one value, e.g. %s %s", name, name, example)
			}
			*dst = args[0]
			return nil
		}
		two := func(a, b *string, expected string) error {
			if len(args) != 2 {
				return d.Errf("store nats: %s: expected %s", name, expected)
			}
			*a, *b = args[0], args[1]
			return nil
		}
		var err error
		switch name {
		case "url":
			if len(args) == 0 {
				return d.Errf("store nats: url: expected one or more URLs, e.g. url nats://n1:4222 nats://n2:4222")
			}
			for _, a := range args {
				for _, u := range strings.Split(a, ",") {
					if u = strings.TrimSpace(u); u != "" {
						n.URLs = append(n.URLs, u)
					}
				}
			}
		case "embedded":
			if len(args) > 1 {
				return d.Errf("store nats: embedded: expected at most a directory")
			}
			n.Embedded = true
			if len(args) == 1 {
				n.Dir = args[0]
			}
		case "replicas":
			var v string
			if err = one(&v, "3"); err == nil {
				if _, err = fmt.Sscanf(v, "%d", &n.Replicas); err != nil {
					return d.Errf("store nats: replicas: %q is not a number", v)
				}
			}
		case "credentials":
			err = one(&n.CredentialsFile, "/etc/nats/proxy.creds")
		case "token":
			err = one(&n.Token, "{env.NATS_TOKEN}")
		case "user":
			err = two(&n.User, &n.Password, "a user and a password, e.g. user caddy {env.NATS_PASSWORD}")
		case "tls_ca":
			err = one(&n.TLSCA, "/etc/nats/ca.pem")
		case "tls_client":
			err = two(&n.TLSCert, &n.TLSKey, "a certificate and a key file")
		case "prefix":
			err = one(&n.Prefix, "mcpr_prod")
		case "drain_timeout", "lease_ttl", "takeover_wait":
			var v string
			if err = one(&v, "30s"); err == nil {
				dur, perr := caddy.ParseDuration(v)
				if perr != nil || dur <= 0 {
					return d.Errf("store nats: %s: %q is not a positive duration", name, v)
				}
				*map[string]*caddy.Duration{"drain_timeout": &n.DrainTimeout, "lease_ttl": &n.LeaseTTL,
					"takeover_wait": &n.TakeoverWait}[name] = caddy.Duration(dur)
			}
		default:
			return d.Errf("store nats: unrecognized option %q", name)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// Interface guards
var (
	_ caddymodule.StoreModule = NATSStore{}
	_ caddymodule.Drainer     = NATSStore{}
	_ caddy.Validator         = (*NATSStore)(nil)
	_ caddyfile.Unmarshaler   = (*NATSStore)(nil)
)
