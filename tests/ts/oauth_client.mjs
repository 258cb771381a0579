// oauth_client.mjs: the official TypeScript MCP SDK client (1.32.2) with an
// OAuth provider, against a server whose access tokens live a couple of
// seconds (oauth_server.mjs), so that tokens are refreshed while the session
// lives, during running calls and between them.
//
//   node oauth_client.mjs <endpoint-url> [--calls=2] [--n=8] [--interval-ms=300]
//        [--ping-ms=250] [--timeout-ms=15000] [--cut-after-refresh] [--cut-after-expiry]
//        [--cut-only-call]
//        [--expire-between=true]
//
// What it does:
//   1. connect: the initialize POST gets 401; the SDK discovers the
//      protected-resource and authorization-server metadata, registers a
//      client (DCR), and calls redirectToAuthorization; this provider
//      "follows" the redirect itself (fetch with redirect: 'manual', the
//      server's /authorize redirects to redirect_uri?code=... at once), then
//      transport.finishAuth(code) and a new transport + client connect, as
//      the SDK's examples do.
//   2. --calls calls of `count` {n, intervalMs} with onprogress, one after
//      the other; during each, a ping every --ping-ms: a ping POST after the
//      token expired gets 401 and makes the SDK refresh mid-call. With
//      --expire-between (default) the client waits, before every call but
//      the first, until its current token has expired (the JWT's exp, or
//      expires_in after it was saved for an opaque token), so the call's POST gets 401 and a refresh happens between
//      calls too.
//   3. --cut-after-refresh: after the first refresh made while a call runs,
//      at that call's next progress notification, every open response is
//      aborted (the sockets close: the same cut as client.mjs), so the SDK
//      resumes the call's stream with a GET carrying Last-Event-ID and the
//      new token. --cut-after-expiry (with --ping-ms=0, so nothing refreshes
//      first) cuts at the first progress notification after the token
//      expired instead: the resume GET carries the expired token.
//      --cut-only-call aborts only the call's POST response, leaving the
//      standalone GET stream open.
//   4. terminateSession() (the DELETE). The SDK does not refresh on a 401 to
//      DELETE (it throws "Failed to terminate session: Unauthorized"), so on
//      401 this client refreshes (auth()) and sends the DELETE once more, as
//      an application has to.
//
// It prints one JSON line on stdout and exits 0 whatever happened:
//   {"sdkVersion",
//    "calls": [{"progress": [1,2,...], "result": "counted to 6", "error": "", "startT", "endT"}],
//    "connectError": "",
//    "authorizations": 1,               // redirectToAuthorization calls
//    "tokenSaves": [{"t","kind":"initial"|"refresh","tokenId","duringCall": i|-1,"phase":"connect"|"calls"|"delete"}],
//    "refreshes": N,                    // saveTokens calls after the first
//    "refreshesDuringCalls": N,         // of those, made while a call's stream was open
//    "refreshesBetweenCalls": N,        // made in the calls phase with no call's stream open
//                                       // (e.g. on the 401 to a call's POST)
//    "pings": {"ok", "failed", "errors": [...]},
//    "cut": {"done", "callIndex", "afterProgress", "aborted", "socketsClosed"},
//    "requests": [{"t","method","path","rpc","lastEventId","tokenId","status",
//                  "contentType","wwwAuthenticate","body","error"}],
//    "delete": {"status": last DELETE's status, "attempts", "error"},
//    "transportErrors": [...]}
// tokenId is the first 12 hex digits of the token's SHA-256 (as the server
// logs it), never the token. body is the first 300 characters of a non-2xx
// answer.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport, StreamableHTTPError } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { auth, UnauthorizedError } from '@modelcontextprotocol/sdk/client/auth.js';
import { createHash } from 'node:crypto';
import diagnostics from 'node:diagnostics_channel';
import { readFileSync } from 'node:fs';

const sdkVersion = JSON.parse(
    readFileSync(new URL('./node_modules/@modelcontextprotocol/sdk/package.json', import.meta.url), 'utf8')
).version;

function options(argv) {
    const opts = {
        url: undefined,
        calls: 2,
        n: 8,
        intervalMs: 300,
        pingMs: 250,
        timeoutMs: 15000,
        cutAfterRefresh: false,
        cutAfterExpiry: false,
        cutOnlyCall: false,
        expireBetween: true
    };
    for (const arg of argv) {
        const m = /^--([a-z-]+)(?:=(.*))?$/.exec(arg);
        if (!m) {
            opts.url = arg;
            continue;
        }
        const [, key, value] = m;
        const bool = value === undefined || value === 'true';
        switch (key) {
            case 'calls': opts.calls = Number(value); break;
            case 'n': opts.n = Number(value); break;
            case 'interval-ms': opts.intervalMs = Number(value); break;
            case 'ping-ms': opts.pingMs = Number(value); break;
            case 'timeout-ms': opts.timeoutMs = Number(value); break;
            case 'cut-after-refresh': opts.cutAfterRefresh = bool; break;
            case 'cut-after-expiry': opts.cutAfterExpiry = bool; break;
            case 'cut-only-call': opts.cutOnlyCall = bool; break;
            case 'expire-between': opts.expireBetween = bool; break;
            default: throw new Error(`unknown option --${key}`);
        }
    }
    if (!opts.url) {
        throw new Error('usage: node oauth_client.mjs <endpoint-url> [--calls=2] [--n=8] [--interval-ms=300] [--ping-ms=250] [--timeout-ms=15000] [--cut-after-refresh] [--expire-between=false]');
    }
    return opts;
}

const opts = options(process.argv.slice(2));
const url = new URL(opts.url);
const started = Date.now();
const now = () => Date.now() - started;
const tokenId = (token) => createHash('sha256').update(token).digest('hex').slice(0, 12);

const out = {
    sdkVersion,
    calls: [],
    connectError: '',
    authorizations: 0,
    tokenSaves: [],
    refreshes: 0,
    refreshesDuringCalls: 0,
    refreshesBetweenCalls: 0,
    pings: { ok: 0, failed: 0, errors: [] },
    cut: { done: false, callIndex: -1, afterProgress: 0, aborted: 0, socketsClosed: 0 },
    requests: [],
    delete: { status: 0, attempts: 0, error: '' },
    transportErrors: []
};

let phase = 'connect';
let currentCall = -1; // index of the call in flight, -1 if none
let callStreamOpen = false; // the call's POST was answered 2xx: its stream runs
let cutArmed = -1; // call index whose next progress notification triggers the cut

// --- the cut (as in client.mjs) ---------------------------------------------

const openSockets = new Set();
let cutting = false;
diagnostics.subscribe('undici:client:connected', ({ socket }) => {
    openSockets.add(socket);
    socket.once('close', () => {
        openSockets.delete(socket);
        if (cutting) {
            out.cut.socketsClosed++;
        }
    });
});

const inflight = new Set(); // requests whose response body is still being read
const pendingBodies = []; // reads of non-2xx bodies, awaited before the report

async function loggingFetch(input, init = {}) {
    const ac = new AbortController();
    const signal = init.signal ? AbortSignal.any([init.signal, ac.signal]) : ac.signal;
    const reqUrl = new URL(input instanceof Request ? input.url : String(input));
    const headers = new Headers(init.headers ?? (input instanceof Request ? input.headers : undefined));
    const method = (init.method ?? (input instanceof Request ? input.method : 'GET')).toUpperCase();
    let rpc = '';
    if (typeof init.body === 'string' && reqUrl.pathname === url.pathname) {
        try {
            const msg = JSON.parse(init.body);
            rpc = Array.isArray(msg) ? 'batch' : (msg.method ?? 'response');
        } catch {
            // not JSON
        }
    }
    const authz = headers.get('authorization') ?? '';
    const record = {
        t: now(),
        method,
        path: reqUrl.pathname,
        rpc,
        lastEventId: headers.get('last-event-id') ?? '',
        tokenId: authz.startsWith('Bearer ') ? tokenId(authz.slice(7)) : '',
        status: 0,
        contentType: '',
        wwwAuthenticate: ''
    };
    out.requests.push(record);
    const entry = { ac, open: true, call: method === 'POST' && rpc === 'tools/call' };
    inflight.add(entry);
    let res;
    try {
        res = await fetch(input, { ...init, signal });
    } catch (err) {
        inflight.delete(entry);
        record.error = String(err?.cause ?? err);
        throw err;
    }
    record.status = res.status;
    if (rpc === 'tools/call' && res.ok) {
        callStreamOpen = true;
    }
    record.contentType = res.headers.get('content-type') ?? '';
    record.wwwAuthenticate = res.headers.get('www-authenticate') ?? '';
    if (res.status >= 400) {
        pendingBodies.push(
            res.clone().text().then(
                (text) => { record.body = text.slice(0, 300); },
                () => {}
            )
        );
    }
    if (!res.body) {
        inflight.delete(entry);
        return res;
    }
    const done = () => {
        entry.open = false;
        inflight.delete(entry);
    };
    const tracked = res.body.pipeThrough(new TransformStream({ flush: done, cancel: done }));
    return new Response(tracked, { status: res.status, statusText: res.statusText, headers: res.headers });
}

function cut(callIndex) {
    if (out.cut.done) {
        return;
    }
    out.cut.done = true;
    out.cut.callIndex = callIndex;
    out.cut.afterProgress = out.calls[callIndex].progress.length;
    cutting = true;
    for (const entry of inflight) {
        if (opts.cutOnlyCall && !entry.call) {
            continue;
        }
        if (entry.open) {
            out.cut.aborted++;
        }
        entry.ac.abort(new Error('connection cut by the test'));
        inflight.delete(entry);
    }
    setTimeout(() => {
        cutting = false;
    }, 100);
}

// --- the OAuth provider ----------------------------------------------------

class InMemoryOAuthProvider {
    constructor() {
        this._clientInformation = undefined;
        this._tokens = undefined;
        this._codeVerifier = undefined;
        this.pendingCode = undefined; // Promise<string> set by redirectToAuthorization
        this.savedAt = 0;
    }
    get redirectUrl() {
        return 'http://127.0.0.1:9/oauth/callback'; // never served: the code is read from Location
    }
    get clientMetadata() {
        return {
            client_name: 'mcp-resume OAuth test client',
            redirect_uris: [this.redirectUrl],
            grant_types: ['authorization_code', 'refresh_token'],
            response_types: ['code'],
            token_endpoint_auth_method: 'none'
        };
    }
    clientInformation() {
        return this._clientInformation;
    }
    saveClientInformation(info) {
        this._clientInformation = info;
    }
    tokens() {
        return this._tokens;
    }
    saveTokens(tokens) {
        const kind = out.tokenSaves.length === 0 ? 'initial' : 'refresh';
        this._tokens = tokens;
        this.savedAt = Date.now();
        const during = callStreamOpen ? currentCall : -1;
        out.tokenSaves.push({ t: now(), kind, tokenId: tokenId(tokens.access_token), duringCall: during, phase, expiresIn: tokens.expires_in });
        if (kind === 'refresh') {
            out.refreshes++;
            if (phase === 'calls') {
                // A refresh caused by the call's own POST (401 before its
                // stream opened) counts as between calls.
                if (during >= 0) {
                    out.refreshesDuringCalls++;
                    if (opts.cutAfterRefresh && !out.cut.done && cutArmed < 0) {
                        cutArmed = currentCall;
                    }
                } else {
                    out.refreshesBetweenCalls++;
                }
            }
        }
    }
    redirectToAuthorization(authorizationUrl) {
        out.authorizations++;
        // The user agent's part, done here: /authorize answers with a redirect
        // to redirect_uri carrying the code.
        this.pendingCode = (async () => {
            const res = await loggingFetch(authorizationUrl, { redirect: 'manual' });
            const location = res.headers.get('location');
            if (!location) {
                throw new Error(`authorization endpoint answered ${res.status} without Location`);
            }
            const back = new URL(location);
            const code = back.searchParams.get('code');
            if (!code) {
                throw new Error(`authorization failed: ${location}`);
            }
            return code;
        })();
    }
    // When the current token expires, in ms since the epoch: a JWT's exp
    // (the client may read it; only the server relies on it), else
    // expires_in after it was saved (oauth_server.mjs rounds that up).
    expiresAt() {
        const token = this._tokens?.access_token ?? '';
        const parts = token.split('.');
        if (parts.length === 3) {
            try {
                const exp = JSON.parse(Buffer.from(parts[1], 'base64url').toString('utf8')).exp;
                if (typeof exp === 'number') {
                    return exp * 1000;
                }
            } catch {
                // not a JWT after all
            }
        }
        return this.savedAt + (this._tokens?.expires_in ?? 0) * 1000;
    }
    saveCodeVerifier(v) {
        this._codeVerifier = v;
    }
    codeVerifier() {
        if (!this._codeVerifier) {
            throw new Error('no code verifier saved');
        }
        return this._codeVerifier;
    }
    invalidateCredentials(scope) {
        out.transportErrors.push(`provider.invalidateCredentials(${scope})`);
        if (scope === 'all' || scope === 'tokens') {
            this._tokens = undefined;
        }
        if (scope === 'all' || scope === 'client') {
            this._clientInformation = undefined;
        }
        if (scope === 'all' || scope === 'verifier') {
            this._codeVerifier = undefined;
        }
    }
}

const provider = new InMemoryOAuthProvider();

function newTransport() {
    return new StreamableHTTPClientTransport(url, {
        authProvider: provider,
        fetch: loggingFetch,
        // As in client.mjs: only the first delay is shorter than the default.
        reconnectionOptions: {
            initialReconnectionDelay: 200,
            maxReconnectionDelay: 30000,
            reconnectionDelayGrowFactor: 1.5,
            maxRetries: 2
        }
    });
}

function newClient() {
    const client = new Client({ name: 'mcp-resume-oauth-test', version: '1.0.0' });
    client.onerror = (err) => {
        out.transportErrors.push(String(err?.message ?? err));
    };
    return client;
}

async function connect() {
    let transport = newTransport();
    let client = newClient();
    try {
        await client.connect(transport, { timeout: opts.timeoutMs });
        return { client, transport };
    } catch (err) {
        if (!(err instanceof UnauthorizedError) || !provider.pendingCode) {
            throw err;
        }
    }
    // The SDK's examples: finish the flow on the transport that started it,
    // then connect anew.
    const code = await provider.pendingCode;
    provider.pendingCode = undefined;
    await transport.finishAuth(code);
    await client.close().catch(() => {});
    transport = newTransport();
    client = newClient();
    await client.connect(transport, { timeout: opts.timeoutMs });
    return { client, transport };
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function runCall(client, i) {
    const call = { progress: [], result: '', error: '', startT: now(), endT: 0 };
    out.calls.push(call);
    currentCall = i;
    let pinging = opts.pingMs > 0;
    const pinger = (async () => {
        while (pinging) {
            await sleep(opts.pingMs);
            if (!pinging) {
                break;
            }
            try {
                await client.ping({ timeout: 5000 });
                out.pings.ok++;
            } catch (err) {
                out.pings.failed++;
                if (out.pings.errors.length < 10) {
                    out.pings.errors.push(String(err?.message ?? err));
                }
            }
        }
    })();
    try {
        const result = await client.callTool(
            { name: 'count', arguments: { n: opts.n, intervalMs: opts.intervalMs } },
            undefined,
            {
                timeout: opts.timeoutMs,
                onprogress: (p) => {
                    call.progress.push(p.progress);
                    if (opts.cutAfterExpiry && !out.cut.done && cutArmed !== -2 && Date.now() >= provider.expiresAt()) {
                        cutArmed = i;
                    }
                    if (cutArmed === i) {
                        cutArmed = -2; // once
                        cut(i);
                    }
                }
            }
        );
        call.result = (result.content ?? []).filter((c) => c.type === 'text').map((c) => c.text).join('');
        if (result.isError) {
            call.error = `tool error: ${call.result}`;
        }
    } catch (err) {
        call.error = String(err?.message ?? err);
    }
    currentCall = -1;
    callStreamOpen = false;
    pinging = false;
    await pinger;
    call.endT = now();
}

async function terminate(transport) {
    for (;;) {
        out.delete.attempts++;
        try {
            await transport.terminateSession();
            out.delete.error = '';
            return;
        } catch (err) {
            out.delete.error = String(err?.message ?? err);
            const unauthorized = err instanceof StreamableHTTPError && err.code === 401;
            if (!unauthorized || out.delete.attempts > 1) {
                return;
            }
            // The SDK does not refresh on a 401 to DELETE: do it here, once.
            const result = await auth(provider, { serverUrl: url, fetchFn: loggingFetch }).catch((e) => String(e?.message ?? e));
            if (result !== 'AUTHORIZED') {
                out.delete.error += `; refresh before retrying the DELETE: ${result}`;
                return;
            }
        }
    }
}

let session;
try {
    session = await connect();
} catch (err) {
    out.connectError = String(err?.message ?? err);
}

if (session) {
    phase = 'calls';
    for (let i = 0; i < opts.calls; i++) {
        if (i > 0 && opts.expireBetween && provider.tokens()) {
            // Until the current token has expired.
            await sleep(Math.max(0, provider.expiresAt() + 50 - Date.now()));
        }
        await runCall(session.client, i);
    }
    // A late duplicate notification (which would be a bug) gets a moment to show.
    await sleep(200);
    phase = 'delete';
    await terminate(session.transport);
    out.delete.status = [...out.requests].reverse().find((r) => r.method === 'DELETE')?.status ?? 0;
    try {
        await session.client.close();
    } catch (err) {
        out.transportErrors.push(`close: ${err?.message ?? err}`);
    }
}

await Promise.all(pendingBodies);
process.stdout.write(JSON.stringify(out) + '\n', () => process.exit(0));
