# The demo MCP server (official Go SDK, no event store).
FROM golang:1.26 AS builder
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -o /mcp-demo-server ./cmd/mcp-demo-server

FROM gcr.io/distroless/static
COPY --from=builder /mcp-demo-server /mcp-demo-server
ENTRYPOINT ["/mcp-demo-server"]
