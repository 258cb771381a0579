// server.mjs: an MCP server on the official TypeScript SDK that is resumable
// by itself, the way the 2025-11-25 spec describes: a per-stream event store
// (the SDK's InMemoryEventStore), retryInterval, and a `count` tool that
// closes its call's SSE stream midway with extra.closeSSEStream() (SEP-1699
// "SSE polling"), expecting the client to come back with Last-Event-ID. It is
// the upstream ts_test.go puts behind mcp_resume, which must follow it.
//
//   node server.mjs <port>      prints "listening <port>" once it listens
//
// count {n, interval_ms, close_after}: n progress notifications interval_ms
// apart on the call's own stream, closing that stream after progress
// close_after, then the result "counted to n".
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { isInitializeRequest } from '@modelcontextprotocol/sdk/types.js';
import { InMemoryEventStore } from '@modelcontextprotocol/sdk/examples/shared/inMemoryEventStore.js';
import { randomUUID } from 'node:crypto';
import http from 'node:http';
import { z } from 'zod';

const port = Number(process.argv[2] ?? 0);
const transports = new Map(); // session id -> transport

function newServer() {
    const server = new McpServer({ name: 'ts-polling-server', version: '1.0.0' });
    server.registerTool(
        'count',
        {
            description: 'Counts to n with progress, closing its SSE stream after close_after.',
            inputSchema: { n: z.number().int(), interval_ms: z.number().int().optional(), close_after: z.number().int().optional() }
        },
        async ({ n, interval_ms = 100, close_after = 0 }, extra) => {
            const token = extra._meta?.progressToken;
            for (let i = 1; i <= n; i++) {
                await new Promise((r) => setTimeout(r, interval_ms));
                if (token !== undefined) {
                    await extra.sendNotification({
                        method: 'notifications/progress',
                        params: { progressToken: token, progress: i, total: n, message: `step ${i} of ${n}` }
                    });
                }
                if (i === close_after && extra.closeSSEStream) {
                    extra.closeSSEStream();
                }
            }
            return { content: [{ type: 'text', text: `counted to ${n}` }] };
        }
    );
    return server;
}

async function readBody(req) {
    const chunks = [];
    for await (const c of req) {
        chunks.push(c);
    }
    const raw = Buffer.concat(chunks).toString('utf8');
    return raw ? JSON.parse(raw) : undefined;
}

const httpServer = http.createServer(async (req, res) => {
    try {
        const sid = req.headers['mcp-session-id'];
        let transport = sid ? transports.get(sid) : undefined;
        const body = req.method === 'POST' ? await readBody(req) : undefined;
        if (!transport) {
            if (req.method !== 'POST' || !isInitializeRequest(body)) {
                res.writeHead(sid ? 404 : 400, { 'Content-Type': 'application/json' });
                res.end(JSON.stringify({ jsonrpc: '2.0', id: null, error: { code: -32001, message: 'Session not found' } }));
                return;
            }
            transport = new StreamableHTTPServerTransport({
                sessionIdGenerator: () => randomUUID(),
                eventStore: new InMemoryEventStore(),
                retryInterval: 300,
                onsessioninitialized: (id) => transports.set(id, transport)
            });
            transport.onclose = () => transport.sessionId && transports.delete(transport.sessionId);
            await newServer().connect(transport);
        }
        await transport.handleRequest(req, res, body);
    } catch (err) {
        if (!res.headersSent) {
            res.writeHead(500);
        }
        res.end(String(err));
    }
});

httpServer.listen(port, '127.0.0.1', () => {
    process.stdout.write(`listening ${httpServer.address().port}\n`);
});
