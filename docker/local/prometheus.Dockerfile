# Prometheus from Debian's prometheus package, for offline stacks (docker/build-local.sh,
# compose.local.yaml). Same interface as the official `prom/prometheus` image: entry point
# `prometheus`, config /etc/prometheus/prometheus.yml, data in /prometheus, user nobody, wget
# for the health check.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends prometheus wget \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /prometheus \
    && chown nobody:nogroup /prometheus
WORKDIR /prometheus
USER 65534:65534
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
