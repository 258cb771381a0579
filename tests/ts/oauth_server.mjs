// oauth_server.mjs: an MCP server on the official TypeScript SDK (1.32.2)
// that is an OAuth 2.1 resource server and its own authorization server, the
// way the MCP 2025-06-18+ authorization spec describes, with short-lived
// access tokens so that clients must refresh while a session lives. It is
// the upstream oauth_test.go puts behind Caddy (reverse_proxy, with or
// without mcp_resume) or talks to directly.
//
//   node oauth_server.mjs [--port=0] [--public-url=http://127.0.0.1:P/mcp]
//                         [--token-ttl-ms=2500] [--user=alice] [--opaque]
//                         [--event-store]
//
// Prints "listening <port>" as its first stdout line, then one JSON line per
// HTTP request it answered (see "Request log" below).
//
// --public-url is the MCP endpoint as clients see it (Caddy's URL when the
// server runs behind Caddy; default http://127.0.0.1:<port>/mcp). It is the
// protected resource (RFC 9728 metadata `resource`, the tokens' `aud`, the
// WWW-Authenticate resource_metadata URL) and its origin is the issuer: the
// authorization endpoints (/authorize, /token, /register, /.well-known/*)
// are served by this process and must be reachable at that origin, so a
// Caddy in front proxies everything and puts mcp_resume on /mcp* only.
//
// Authorization (the SDK's mcpAuthRouter with the provider below):
//   - dynamic client registration (public clients, token_endpoint_auth_method
//     none), authorization code + PKCE (the SDK's token handler checks S256);
//     /authorize has no login page: it redirects to redirect_uri with a code
//     at once, for the user --user;
//   - access tokens are HS256 JWTs signed with a random per-process secret
//     (claims iss, sub, aud = public URL, iat, exp, client_id, jti), living
//     --token-ttl-ms; with --opaque they are random strings looked up in a map;
//   - refresh tokens are opaque and are not rotated (the same one comes back),
//     so concurrent refreshes by one client (the SDK does not single-flight
//     them) both succeed;
//   - verifyAccessToken checks the signature (or the map), exp and aud;
//     requireBearerAuth answers 401 + WWW-Authenticate: Bearer error=
//     "invalid_token", error_description, resource_metadata.
//
// MCP: a stateful StreamableHTTPServerTransport per session (sessionIdGenerator
// randomUUID), no event store unless --event-store (then the SDK's
// InMemoryEventStore: the server is resumable by itself, for the direct and
// reverse_proxy controls of a cut). Sessions are NOT bound to the token's
// user (the TS SDK server does not do that; the Go SDK server does): any
// valid token is accepted on any session. Tool `count` {n, intervalMs}: n
// progress notifications intervalMs apart (when _meta.progressToken is
// given), then the text "counted to n".
//
// Test-only endpoint, POST /test/mint with JSON
//   {sub = --user, aud = public URL, expInMs = ttl, forge = false}
// answers {"access_token"} for that principal, audience and lifetime; forge
// signs it with another secret (same claims, bad signature; with --opaque, a
// string the server never issued). A negative expInMs gives an expired token.
//
// Request log: one JSON line on stdout per request, written when the
// response ends (or the connection closes):
//   {"t": ms since start, "method", "path", "session": Mcp-Session-Id or "",
//    "rpc": JSON-RPC method(s) of a POST body, "lastEventId",
//    "auth": "none"|"valid"|"expired"|"bad"|"wrong-aud"|"malformed", "sub",
//    "tokenId": short hash of the bearer token (never the token),
//    "status", "closed": true if the connection went before the response ended}
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { mcpAuthRouter, getOAuthProtectedResourceMetadataUrl } from '@modelcontextprotocol/sdk/server/auth/router.js';
import { requireBearerAuth } from '@modelcontextprotocol/sdk/server/auth/middleware/bearerAuth.js';
import { InvalidTokenError, InvalidGrantError } from '@modelcontextprotocol/sdk/server/auth/errors.js';
import { InMemoryEventStore } from '@modelcontextprotocol/sdk/examples/shared/inMemoryEventStore.js';
import { isInitializeRequest } from '@modelcontextprotocol/sdk/types.js';
import { createHash, createHmac, randomBytes, randomUUID, timingSafeEqual } from 'node:crypto';
import express from 'express';
import { z } from 'zod';

function options(argv) {
    const opts = { port: 0, publicUrl: '', tokenTtlMs: 2500, user: 'alice', opaque: false, eventStore: false };
    for (const arg of argv) {
        const m = /^--([a-z-]+)(?:=(.*))?$/.exec(arg);
        if (!m) {
            throw new Error(`unexpected argument ${arg}`);
        }
        const [, key, value] = m;
        switch (key) {
            case 'port': opts.port = Number(value); break;
            case 'public-url': opts.publicUrl = value; break;
            case 'token-ttl-ms': opts.tokenTtlMs = Number(value); break;
            case 'user': opts.user = value; break;
            case 'opaque': opts.opaque = value !== 'false'; break;
            case 'event-store': opts.eventStore = value !== 'false'; break;
            default: throw new Error(`unknown option --${key}`);
        }
    }
    return opts;
}

const opts = options(process.argv.slice(2));
const started = Date.now();
const secret = randomBytes(32);
const forgerSecret = randomBytes(32);

const b64url = (buf) => Buffer.from(buf).toString('base64url');
const tokenId = (token) => createHash('sha256').update(token).digest('hex').slice(0, 12);

function signJwt(claims, key) {
    const head = b64url(JSON.stringify({ alg: 'HS256', typ: 'JWT' }));
    const body = b64url(JSON.stringify(claims));
    const sig = b64url(createHmac('sha256', key).update(`${head}.${body}`).digest());
    return `${head}.${body}.${sig}`;
}

// Set once the server listens (the default public URL needs the port).
let publicUrl; // URL of the MCP endpoint as clients see it
let issuer; // its origin, with a trailing slash as URL.href gives it

const opaqueTokens = new Map(); // opaque access token -> claims
const refreshTokens = new Map(); // refresh token -> {sub, clientId, aud}
const codes = new Map(); // authorization code -> {clientId, challenge, redirectUri, sub, aud}
const clients = new Map(); // client_id -> client information

function mint({ sub = opts.user, aud = publicUrl.href, expInMs = opts.tokenTtlMs, clientId = 'minted', forge = false } = {}) {
    const nowMs = Date.now();
    // NumericDate may be fractional (RFC 7519 §2); millisecond precision
    // keeps a 2.5 s lifetime exact.
    const claims = {
        iss: issuer.href,
        sub,
        aud,
        iat: Math.floor(nowMs / 1000),
        exp: (nowMs + expInMs) / 1000,
        client_id: clientId,
        jti: randomUUID()
    };
    if (opts.opaque) {
        const token = b64url(randomBytes(24));
        if (!forge) {
            opaqueTokens.set(token, claims);
        }
        return { token, claims };
    }
    return { token: signJwt(claims, forge ? forgerSecret : secret), claims };
}

// classify tells what a bearer token is, for verification and the log.
function classify(token) {
    let claims;
    if (opts.opaque) {
        claims = opaqueTokens.get(token);
        if (!claims) {
            return { auth: 'bad' };
        }
    } else {
        const parts = token.split('.');
        if (parts.length !== 3) {
            return { auth: 'malformed' };
        }
        const want = createHmac('sha256', secret).update(`${parts[0]}.${parts[1]}`).digest();
        const got = Buffer.from(parts[2], 'base64url');
        if (got.length !== want.length || !timingSafeEqual(got, want)) {
            let sub;
            try {
                sub = JSON.parse(Buffer.from(parts[1], 'base64url').toString('utf8')).sub;
            } catch {
                // unreadable claims
            }
            return { auth: 'bad', sub };
        }
        claims = JSON.parse(Buffer.from(parts[1], 'base64url').toString('utf8'));
    }
    if (typeof claims.exp !== 'number' || claims.exp * 1000 <= Date.now()) {
        return { auth: 'expired', sub: claims.sub, claims };
    }
    if (claims.aud !== publicUrl.href) {
        return { auth: 'wrong-aud', sub: claims.sub, claims };
    }
    return { auth: 'valid', sub: claims.sub, claims };
}

function issueTokens(clientId, sub, aud) {
    const { token } = mint({ sub, aud, clientId });
    let refresh;
    for (const [rt, v] of refreshTokens) {
        if (v.clientId === clientId && v.sub === sub) {
            refresh = rt; // not rotated: see the header comment
        }
    }
    if (!refresh) {
        refresh = b64url(randomBytes(24));
        refreshTokens.set(refresh, { clientId, sub, aud });
    }
    return {
        access_token: token,
        token_type: 'bearer',
        expires_in: Math.max(1, Math.ceil(opts.tokenTtlMs / 1000)), // rounded up: a client that waits expires_in finds it expired
        refresh_token: refresh
    };
}

const provider = {
    clientsStore: {
        getClient: async (id) => clients.get(id),
        registerClient: async (client) => {
            clients.set(client.client_id, client);
            return client;
        }
    },
    // No login page: the user is --user, consent is implied.
    async authorize(client, params, res) {
        const code = b64url(randomBytes(16));
        codes.set(code, {
            clientId: client.client_id,
            challenge: params.codeChallenge,
            redirectUri: params.redirectUri,
            sub: opts.user
        });
        const target = new URL(params.redirectUri);
        target.searchParams.set('code', code);
        if (params.state !== undefined) {
            target.searchParams.set('state', params.state);
        }
        res.redirect(302, target.href);
    },
    async challengeForAuthorizationCode(client, code) {
        const c = codes.get(code);
        if (!c || c.clientId !== client.client_id) {
            throw new InvalidGrantError('unknown authorization code');
        }
        return c.challenge;
    },
    async exchangeAuthorizationCode(client, code, _verifier, redirectUri, resource) {
        const c = codes.get(code);
        if (!c || c.clientId !== client.client_id) {
            throw new InvalidGrantError('unknown authorization code');
        }
        if (redirectUri !== undefined && redirectUri !== c.redirectUri) {
            throw new InvalidGrantError('redirect_uri differs from the authorization request');
        }
        if (resource !== undefined && resource.href !== publicUrl.href) {
            throw new InvalidGrantError(`resource ${resource.href} is not ${publicUrl.href}`);
        }
        codes.delete(code);
        return issueTokens(client.client_id, c.sub, publicUrl.href);
    },
    async exchangeRefreshToken(client, refreshToken, _scopes, resource) {
        const r = refreshTokens.get(refreshToken);
        if (!r || r.clientId !== client.client_id) {
            throw new InvalidGrantError('unknown refresh token');
        }
        if (resource !== undefined && resource.href !== publicUrl.href) {
            throw new InvalidGrantError(`resource ${resource.href} is not ${publicUrl.href}`);
        }
        return issueTokens(client.client_id, r.sub, r.aud);
    },
    async verifyAccessToken(token) {
        const c = classify(token);
        switch (c.auth) {
            case 'valid':
                return {
                    token,
                    clientId: c.claims.client_id,
                    scopes: [],
                    expiresAt: c.claims.exp,
                    resource: new URL(c.claims.aud),
                    extra: { sub: c.claims.sub, iss: c.claims.iss }
                };
            case 'expired':
                throw new InvalidTokenError('Token has expired');
            case 'wrong-aud':
                throw new InvalidTokenError('Token was not issued for this resource');
            default:
                throw new InvalidTokenError('Invalid token');
        }
    }
};

function newMcpServer() {
    const server = new McpServer({ name: 'ts-oauth-server', version: '1.0.0' });
    server.registerTool(
        'count',
        {
            description: 'Counts to n, one progress notification every intervalMs.',
            inputSchema: { n: z.number().int(), intervalMs: z.number().int().optional() }
        },
        async ({ n, intervalMs = 100 }, extra) => {
            const token = extra._meta?.progressToken;
            for (let i = 1; i <= n; i++) {
                await new Promise((r) => setTimeout(r, intervalMs));
                if (token !== undefined) {
                    await extra.sendNotification({
                        method: 'notifications/progress',
                        params: { progressToken: token, progress: i, total: n, message: `step ${i} of ${n}` }
                    });
                }
            }
            return { content: [{ type: 'text', text: `counted to ${n}` }] };
        }
    );
    return server;
}

const transports = new Map(); // session id -> transport

function logLine(entry) {
    process.stdout.write(JSON.stringify(entry) + '\n');
}

function rpcOf(body) {
    if (body === undefined || body === null || typeof body !== 'object') {
        return '';
    }
    const msgs = Array.isArray(body) ? body : [body];
    return msgs.map((m) => m.method ?? (m.id !== undefined ? 'response' : '?')).join(',');
}

const app = express();

// The request log, first of all middleware so that it sees every request.
app.use((req, res, next) => {
    const entry = {
        t: Date.now() - started,
        method: req.method,
        path: req.path,
        session: req.headers['mcp-session-id'] ?? '',
        rpc: '',
        lastEventId: req.headers['last-event-id'] ?? '',
        auth: 'none',
        sub: undefined,
        tokenId: undefined,
        status: 0
    };
    const header = req.headers.authorization;
    if (header) {
        const [type, token] = header.split(' ');
        if (type?.toLowerCase() !== 'bearer' || !token) {
            entry.auth = 'malformed';
        } else {
            const c = classify(token);
            entry.auth = c.auth;
            entry.sub = c.sub;
            entry.tokenId = tokenId(token);
        }
    }
    res.locals.logEntry = entry;
    let logged = false;
    const done = (closed) => {
        if (logged) {
            return;
        }
        logged = true;
        entry.status = res.statusCode;
        if (closed) {
            entry.closed = true;
        }
        logLine(entry);
    };
    res.on('finish', () => done(false));
    res.on('close', () => done(!res.writableFinished));
    next();
});

app.post('/test/mint', express.json(), (req, res) => {
    const { sub, aud, expInMs, forge } = req.body ?? {};
    const { token, claims } = mint({ sub, aud, expInMs, forge: !!forge });
    res.json({ access_token: token, claims });
});

async function mcpHandler(req, res) {
    try {
        const sid = req.headers['mcp-session-id'];
        let transport = sid ? transports.get(sid) : undefined;
        if (!transport) {
            if (req.method !== 'POST' || !isInitializeRequest(req.body)) {
                res.status(sid ? 404 : 400).json({ jsonrpc: '2.0', id: null, error: { code: -32001, message: 'Session not found' } });
                return;
            }
            transport = new StreamableHTTPServerTransport({
                sessionIdGenerator: () => randomUUID(),
                eventStore: opts.eventStore ? new InMemoryEventStore() : undefined,
                onsessioninitialized: (id) => transports.set(id, transport)
            });
            transport.onclose = () => transport.sessionId && transports.delete(transport.sessionId);
            await newMcpServer().connect(transport);
        }
        await transport.handleRequest(req, res, req.body);
    } catch (err) {
        if (!res.headersSent) {
            res.status(500);
        }
        res.end(String(err));
    }
}

const httpServer = app.listen(opts.port, '127.0.0.1', () => {
    const port = httpServer.address().port;
    publicUrl = new URL(opts.publicUrl || `http://127.0.0.1:${port}/mcp`);
    issuer = new URL(publicUrl.origin);
    // Rate limits off: a test makes many requests from one address.
    app.use(mcpAuthRouter({
        provider,
        issuerUrl: issuer,
        resourceServerUrl: publicUrl,
        resourceName: 'mcp-resume OAuth test server',
        authorizationOptions: { rateLimit: false },
        tokenOptions: { rateLimit: false },
        clientRegistrationOptions: { rateLimit: false },
        revocationOptions: { rateLimit: false }
    }));
    const bearer = requireBearerAuth({
        verifier: provider,
        resourceMetadataUrl: getOAuthProtectedResourceMetadataUrl(publicUrl),
        expectedResource: publicUrl
    });
    app.all(
        publicUrl.pathname,
        express.json(),
        (req, res, next) => {
            res.locals.logEntry.rpc = rpcOf(req.body);
            next();
        },
        bearer,
        mcpHandler
    );
    process.stdout.write(`listening ${port}\n`);
});
