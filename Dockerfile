# syntax=docker/dockerfile:1
# stocksvr image: `docker build -t stocksvr .` (docker-compose.yml builds it as service `stocksvr`).

# ---- build ------------------------------------------------------------------------------------
FROM rust:1-bookworm AS build
# rdkafka builds the bundled librdkafka (C, C++, make; cmake for its optional cmake build),
# linked against the system OpenSSL (TLS and SASL SCRAM to Kafka): libssl-dev, pkg-config.
RUN apt-get update \
 && apt-get install -y --no-install-recommends cmake libssl-dev pkg-config \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Only what the build reads (BuildKit then sends only these, not .stack/ or target/).
# schemas/ and migrations/ (and lua/ scripts, if include_str!'d) are embedded at compile time.
COPY Cargo.toml Cargo.lock ./
COPY processors processors
COPY schemas schemas
COPY migrations migrations
COPY lua lua
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p stocksvr \
 && cp target/release/stocksvr /usr/local/bin/stocksvr

# ---- runtime ----------------------------------------------------------------------------------
FROM debian:bookworm-slim
# curl: the compose healthcheck; ca-certificates: TLS to external brokers/registries;
# libssl3: librdkafka's OpenSSL.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl libssl3 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /etc/stocksvr stocksvr
COPY --from=build /usr/local/bin/stocksvr /usr/local/bin/stocksvr
COPY topics.yaml /etc/stocksvr/topics.yaml
WORKDIR /etc/stocksvr
USER stocksvr
ENV STOCKSVR__HTTP__LISTEN=0.0.0.0:8080 \
    STOCKSVR__KAFKA__TOPICS_FILE=/etc/stocksvr/topics.yaml
EXPOSE 8080
ENTRYPOINT ["stocksvr"]
CMD ["all"]
