"""The CPU side of benchmarks/gpu_check.sh: its Python driver runs end to end on the CPU with
tiny models (--device cpu --quick), every backend passes its parity check, and the report has
all four sections. The CUDA run itself happens only where a GPU is lent."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gpu_check_driver_runs_on_cpu(tmp_path):
    out = tmp_path / "report.md"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.gpu_check",
            "--device",
            "cpu",
            "--quick",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = out.read_text()
    for section in ("Parity", "Decode tokens/s", "Streams"):
        assert section in text
    parity_rows = [
        line for line in text.splitlines() if line.startswith("| LM") or line.startswith("| audio")
    ]
    assert len(parity_rows) == 6 and all(line.rstrip().endswith("| ok |") for line in parity_rows)


def test_gpu_check_script_is_ready():
    script = ROOT / "benchmarks" / "gpu_check.sh"
    text = script.read_text()
    assert script.stat().st_mode & 0o111, "gpu_check.sh must be executable"
    assert "--device cuda" in text and "timeout" in text
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
