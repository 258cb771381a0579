# Caddy with mcp-resume, built the way Caddy's docs recommend for plugins:
# the official builder image runs xcaddy, the result replaces the binary of
# the official runtime image.
#
#   docker build -f xcaddy.Dockerfile -t caddy-mcp-resume .
#   docker run --rm -p 8081:8081 -v $PWD/Caddyfile:/etc/caddy/Caddyfile caddy-mcp-resume
FROM caddy:2.11-builder AS builder
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    xcaddy build v2.11.9 \
      --output /usr/bin/caddy \
      --with github.com/mcpresume/caddy-mcp-resume@v0.0.0=.

FROM caddy:2.11
COPY --from=builder /usr/bin/caddy /usr/bin/caddy
