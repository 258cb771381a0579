// client.mjs: the official TypeScript MCP SDK client calls the demo server's
// `count` tool with progress, and has its connections cut mid-stream, once.
//
//   node client.mjs <endpoint-url> [--n=12] [--interval-ms=150] [--cut-after=4]
//                   [--timeout-ms=30000] [--offer-version=2025-06-18]
//                   [--close-after=0]
//
// --close-after=K asks the tool to close its call's SSE stream after progress
// K (server.mjs does; the demo server ignores it).
//
// Every option can also be given as an environment variable
// (MCP_TS_N, MCP_TS_INTERVAL_MS, MCP_TS_CUT_AFTER, MCP_TS_TIMEOUT_MS,
// MCP_TS_OFFER_VERSION); argv wins. --cut-after=0 disables the cut.
//
// It prints exactly one JSON line on stdout and exits 0 whatever happened to
// the call (ts_test.go makes the assertions):
//
//   {"sdkVersion", "offeredVersion", "negotiatedVersion",
//    "progress": [1, 2, ...],          // onprogress values, in arrival order
//    "result": "counted to 12",        // text of the tool result, "" if none
//    "error": "",                      // the call's (or connect's) error, if any
//    "cut": {"done", "afterProgress", "aborted", "socketsClosed"},
//    "requests": [{"method", "status", "contentType", "lastEventId", "rpc"}],
//    "transportErrors": ["..."]}       // what the transport reported to onerror
//
// How the cut works: the transport is given a custom `fetch` (the SDK uses it
// for every POST, GET and DELETE) that gives each request its own
// AbortController, combined with the SDK's own signal, and tracks the
// requests whose response body is still being read. After the cut-after-th
// progress notification, every such request is aborted. Aborting a fetch
// whose body is mid-read makes undici destroy the socket, so the TCP
// connection really closes and the proxy sees the client go; the SDK's reader
// then throws, and _handleSseStream decides whether to reconnect (see
// ts_test.go for the rules). Sockets closed within the cut are counted from
// undici's diagnostics channel as evidence.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { LATEST_PROTOCOL_VERSION } from '@modelcontextprotocol/sdk/types.js';
import diagnostics from 'node:diagnostics_channel';
import { readFileSync } from 'node:fs';

const sdkVersion = JSON.parse(
    readFileSync(new URL('./node_modules/@modelcontextprotocol/sdk/package.json', import.meta.url), 'utf8')
).version;

function options(argv) {
    const opts = {
        url: undefined,
        n: Number(process.env.MCP_TS_N ?? 12),
        intervalMs: Number(process.env.MCP_TS_INTERVAL_MS ?? 150),
        cutAfter: Number(process.env.MCP_TS_CUT_AFTER ?? 4),
        timeoutMs: Number(process.env.MCP_TS_TIMEOUT_MS ?? 30000),
        offerVersion: process.env.MCP_TS_OFFER_VERSION || '',
        closeAfter: 0
    };
    for (const arg of argv) {
        const m = /^--([a-z-]+)=(.*)$/.exec(arg);
        if (!m) {
            opts.url = arg;
            continue;
        }
        const [, key, value] = m;
        switch (key) {
            case 'n': opts.n = Number(value); break;
            case 'interval-ms': opts.intervalMs = Number(value); break;
            case 'cut-after': opts.cutAfter = Number(value); break;
            case 'timeout-ms': opts.timeoutMs = Number(value); break;
            case 'offer-version': opts.offerVersion = value; break;
            case 'close-after': opts.closeAfter = Number(value); break;
            default: throw new Error(`unknown option --${key}`);
        }
    }
    if (!opts.url) {
        throw new Error('usage: node client.mjs <endpoint-url> [--n=12] [--interval-ms=150] [--cut-after=4] [--timeout-ms=30000] [--offer-version=V]');
    }
    return opts;
}

const opts = options(process.argv.slice(2));

const out = {
    sdkVersion,
    offeredVersion: opts.offerVersion || LATEST_PROTOCOL_VERSION,
    negotiatedVersion: '',
    progress: [],
    result: '',
    error: '',
    cut: { done: false, afterProgress: 0, aborted: 0, socketsClosed: 0 },
    requests: [],
    transportErrors: []
};

// Sockets undici opens, so the cut can count the ones it closed.
const openSockets = new Set();
diagnostics.subscribe('undici:client:connected', ({ socket }) => {
    openSockets.add(socket);
    socket.once('close', () => {
        openSockets.delete(socket);
        if (cutting) {
            out.cut.socketsClosed++;
        }
    });
});
let cutting = false;

// Requests whose response body is still being read.
const inflight = new Set();

async function cuttableFetch(url, init = {}) {
    const ac = new AbortController();
    const signal = init.signal ? AbortSignal.any([init.signal, ac.signal]) : ac.signal;
    const headers = new Headers(init.headers);
    const method = (init.method ?? 'GET').toUpperCase();
    let body = init.body;
    let rpc = '';
    if (typeof body === 'string') {
        try {
            const msg = JSON.parse(body);
            rpc = Array.isArray(msg) ? 'batch' : (msg.method ?? 'response');
            // SDK 1.32.2 always offers LATEST_PROTOCOL_VERSION (2025-11-25) and
            // has no option to offer another. To test an older negotiated
            // version, offer it here as an older SDK would; the SDK accepts
            // any version in SUPPORTED_PROTOCOL_VERSIONS the server answers
            // with, and then sends it in MCP-Protocol-Version.
            if (opts.offerVersion && msg.method === 'initialize') {
                msg.params.protocolVersion = opts.offerVersion;
                body = JSON.stringify(msg);
            }
        } catch {
            // not JSON: pass it on unchanged
        }
    }
    const record = { method, rpc, lastEventId: headers.get('last-event-id') ?? '', status: 0, contentType: '' };
    out.requests.push(record);
    const entry = { ac, open: true };
    inflight.add(entry);
    let res;
    try {
        res = await fetch(url, { ...init, body, signal });
    } catch (err) {
        inflight.delete(entry);
        record.error = String(err?.cause ?? err);
        throw err;
    }
    record.status = res.status;
    record.contentType = res.headers.get('content-type') ?? '';
    if (!res.body) {
        inflight.delete(entry);
        return res;
    }
    // Forget the request once its body has been read to the end (or failed).
    const done = () => {
        entry.open = false;
        inflight.delete(entry);
    };
    const tracked = res.body.pipeThrough(
        new TransformStream({
            flush: done,
            cancel: done
        })
    );
    return new Response(tracked, { status: res.status, statusText: res.statusText, headers: res.headers });
}

function cut() {
    if (out.cut.done) {
        return;
    }
    out.cut.done = true;
    out.cut.afterProgress = out.progress.length;
    cutting = true;
    for (const entry of inflight) {
        if (entry.open) {
            out.cut.aborted++;
        }
        entry.ac.abort(new Error('connection cut by the test'));
    }
    inflight.clear();
    // Sockets close asynchronously; count those that close within 100ms.
    setTimeout(() => {
        cutting = false;
    }, 100);
}

const transport = new StreamableHTTPClientTransport(new URL(opts.url), {
    fetch: cuttableFetch,
    // Reconnection: only the first delay differs from the SDK default
    // (1000ms -> 200ms) so the test is not slow. maxRetries stays at the
    // default 2 and the other fields at their defaults; the SDK replaces the
    // whole object, so they are spelled out. A server-sent `retry:` field
    // would override the delay.
    reconnectionOptions: {
        initialReconnectionDelay: 200,
        maxReconnectionDelay: 30000,
        reconnectionDelayGrowFactor: 1.5,
        maxRetries: 2
    }
});

const client = new Client({ name: 'mcp-resume-ts-test', version: '1.0.0' });
client.onerror = err => {
    out.transportErrors.push(String(err?.message ?? err));
};

try {
    await client.connect(transport, { timeout: opts.timeoutMs });
    out.negotiatedVersion = transport.protocolVersion ?? '';
    const result = await client.callTool(
        {
            name: 'count',
            arguments: opts.closeAfter > 0
                ? { n: opts.n, interval_ms: opts.intervalMs, close_after: opts.closeAfter }
                : { n: opts.n, interval_ms: opts.intervalMs }
        },
        undefined,
        {
            // Generous: the call takes n*interval (1.8s by default) plus a
            // reconnection. The control (no proxy) sets it short instead,
            // since there the call just hangs until this timeout.
            timeout: opts.timeoutMs,
            // Setting onprogress makes the SDK send _meta.progressToken.
            onprogress: p => {
                out.progress.push(p.progress);
                if (opts.cutAfter > 0 && out.progress.length === opts.cutAfter) {
                    cut();
                }
            }
        }
    );
    out.result = (result.content ?? [])
        .filter(c => c.type === 'text')
        .map(c => c.text)
        .join('');
    if (result.isError) {
        out.error = `tool error: ${out.result}`;
    }
    // Notifications are dispatched in order with the result on one stream,
    // but give a late duplicate (which would be a bug) a moment to show.
    await new Promise(r => setTimeout(r, 200));
} catch (err) {
    out.error = String(err?.message ?? err);
}

try {
    await client.close();
} catch (err) {
    out.transportErrors.push(`close: ${err?.message ?? err}`);
}
process.stdout.write(JSON.stringify(out) + '\n', () => process.exit(0));
