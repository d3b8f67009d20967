#!/usr/bin/env bash
# Device check of every backend in one run (< 8 minutes on an H200): CUDA parity of torch,
# torch-fast (CUDA graphs) and onnx (CUDA execution provider), graph capture, decode tokens/s at
# batch 1..4096 and concurrent 16 kHz streams per GPU. Writes a markdown table to $1, else to
# $OUT/gpu_check.md, else ./gpu_check.md.
#   bash benchmarks/gpu_check.sh [REPORT.md]
set -euo pipefail
cd "$(dirname "$0")/.."
report="${1:-${OUT:-.}/gpu_check.md}"
py="${PYTHON:-.venv/bin/python}"
[ -x "$py" ] || py=python3
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$py" -c "import torch, onnxruntime as o; print(torch.__version__, torch.cuda.is_available(), o.get_available_providers())"
timeout 470 "$py" -m benchmarks.gpu_check --device cuda --out "$report"
echo "report: $report"
