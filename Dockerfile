# Multi-stage build of a small mcp-gateway image: `docker compose up` uses it.
FROM rust:1-slim-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
# The workspace's other member (the load tool): cargo loads every member's manifest.
COPY bench ./bench
RUN cargo build --release --locked --bin mcp-gateway \
    && strip target/release/mcp-gateway

FROM debian:bookworm-slim
# python3 runs the fixture servers of the shipped gateway.toml; drop it if yours need none.
RUN apt-get update && apt-get install -y --no-install-recommends python3 ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/mcp-gateway /usr/local/bin/mcp-gateway
WORKDIR /app
COPY gateway.toml ./
COPY tests/fixtures ./tests/fixtures
EXPOSE 8080
ENTRYPOINT ["mcp-gateway"]
CMD ["serve", "--config", "/app/gateway.toml", "--listen", "0.0.0.0:8080"]
