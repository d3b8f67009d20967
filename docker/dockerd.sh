#!/usr/bin/env bash
# Start or stop a Docker engine for the end-to-end tests (tests/docker/test_compose_e2e.py).
#   docker/dockerd.sh start   start dockerd (as root, in the background) when none answers;
#                             prints "started" when this call started it, "running" otherwise
#   docker/dockerd.sh stop    stop the dockerd that `start` started (its pid file), if any
# Needs Debian's docker.io (scripts/setup.sh installs it). Without root or without dockerd it
# prints why and exits 0, so the tests skip with that reason instead of CI failing here.
set -euo pipefail
pidfile=${DLR_DOCKERD_PIDFILE:-/tmp/dlr-dockerd.pid}
log=${DLR_DOCKERD_LOG:-/tmp/dlr-dockerd.log}

answers() { timeout 10 docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

case "${1:-}" in
  start)
    if answers; then echo "running"; exit 0; fi
    if ! command -v dockerd >/dev/null 2>&1; then echo "no dockerd (apt-get install docker.io)"; exit 0; fi
    if [ "$(id -u)" != 0 ]; then echo "dockerd needs root"; exit 0; fi
    nohup dockerd >"$log" 2>&1 &
    echo $! >"$pidfile"
    for _ in $(seq 60); do
      if answers; then echo "started"; exit 0; fi
      if ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then break; fi
      sleep 1
    done
    echo "dockerd did not come up (log: $log):"; tail -5 "$log" || true
    ;;
  stop)
    [ -f "$pidfile" ] || exit 0
    pid=$(cat "$pidfile")
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid"
      for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    fi
    rm -f "$pidfile"
    ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
