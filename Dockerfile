# headroom's image: the CLI (`headroom`, with `headroom-node` for `up` and `doctor`), the
# coordinator and the agent (the Helm chart runs both from it).
#   docker build -t headroom:0.1.0 .
# Jobs run inside the agent's container: for a lab's agents, build FROM this image with the
# training stack and the Unix users jobs run as, and point the chart's image at it.

FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bins \
 && install -D -m 0755 -t /out \
      target/release/headroom target/release/headroom-node \
      target/release/headroom-coordinator target/release/headroom-agent

FROM debian:bookworm-slim
# ca-certificates: a coordinator behind TLS; procps: `ps` when looking into a node.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates procps \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --user-group --home-dir /var/lib/headroom --create-home headroom
COPY --from=build /out/ /usr/local/bin/
# The coordinator runs as this user; the chart runs the agent as root (jobs run as their
# users, see its values.yaml).
USER 10001:10001
WORKDIR /var/lib/headroom
EXPOSE 7420 9421
CMD ["headroom-coordinator", "--listen", "0.0.0.0:7420"]
