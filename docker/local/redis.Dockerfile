# Redis from Debian's redis-server, for offline stacks (docker/build-local.sh, compose.local.yaml).
# Same interface as the official `redis` image: `redis-server` on PATH, data in /data.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends redis-server \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /data \
    && chown redis:redis /data
WORKDIR /data
# the package's own user (its uid is assigned at install)
# hadolint ignore=DL3066
USER redis
EXPOSE 6379
CMD ["redis-server", "--protected-mode", "no", "--dir", "/data"]
