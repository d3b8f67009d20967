#!/usr/bin/env bash
# Every throughput figure of benchmarks/RESULTS.md in one run (run it on a quiet machine: the
# load average is logged on stderr before each benchmark and at the end): real-time speech streams per
# server with the engine-alone ceiling and memory per stream, the fused decode step, the peers
# (GPT-2 with a KV cache, Mamba), the roofline, concurrent audio streams per backend, DLR vs a
# KV-cache Transformer, and the server load generator (speech + generation). ~20 min on 2 cores.
#   bash benchmarks/run_throughput.sh [RESULTS.md]   (default: benchmarks/results/throughput-<UTC time>.md)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-benchmarks/results/throughput-$(date -u +%Y%m%d-%H%M).md}"
py="${PYTHON:-.venv/bin/python}"
mkdir -p "$(dirname "$out")"
step() { echo "[$(date -u +%T)] $* (load: $(cut -d' ' -f1-3 /proc/loadavg))" >&2; }

step "real-time speech streams per server"
"$py" -m benchmarks.bench_stream_capacity --streams 64 96 128 192 256 320 384 --chunk-ms 100 20 \
    --workers 1 --seconds 10 --repeats 3 --stop-after-miss --results "$out"
step "fused decode step"
"$py" -m benchmarks.bench_fused --rounds 3 --budget 0.4 --results "$out"
step "peers"
"$py" -m benchmarks.bench_peers --rounds 2 --budget 0.3 --results "$out"
step "roofline"
"$py" -m benchmarks.bench_roofline --results "$out"
step "concurrent audio streams per backend"
"$py" -m benchmarks.bench_audio_streams --results "$out"
step "DLR vs KV-cache Transformer"
"$py" -m benchmarks.bench_decode --results "$out"
step "server load generator"
{
    echo
    echo "## Server load (benchmarks/load_server.py)"
    echo
    echo '```'
    "$py" benchmarks/load_server.py --streams 1 8 32 64 128 --gens 1 16 64 --seconds 5 --batch-sizes 64 1
    echo '```'
} >> "$out"
step "done: $out"
