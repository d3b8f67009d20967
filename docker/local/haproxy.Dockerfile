# HAProxy from Debian's haproxy, for offline stacks (docker/build-local.sh, compose.local.yaml).
# Same interface as the official `haproxy` image: config at /usr/local/etc/haproxy/haproxy.cfg.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends haproxy \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /usr/local/etc/haproxy
# the package's own user (its uid is assigned at install)
# hadolint ignore=DL3066
USER haproxy
CMD ["haproxy", "-W", "-db", "-f", "/usr/local/etc/haproxy/haproxy.cfg"]
