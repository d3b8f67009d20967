"""Small shared helpers of the fast-path benchmarks: timing, machine line, tables, results.

Each benchmark prints a markdown table, writes a PNG and (with --results FILE) appends a section
with the exact command and the machine to FILE.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.bench_runtime import cpu_name

ROOT = Path(__file__).resolve().parent.parent
PLOTS = ROOT / "benchmarks" / "plots"


def machine() -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        f"{cpu_name()}, nproc {os.cpu_count()}, torch threads {torch.get_num_threads()}, "
        f"load average {load:.1f} at start"
    )


def time_calls(
    fn: Callable[[], object], budget_s: float, min_calls: int = 3, max_calls: int = 1000
):
    """Call fn until `budget_s` seconds or `max_calls` (at least `min_calls`); seconds per call
    (median of the calls, robust to the noise of a shared CPU) and the number of calls."""
    fn()  # warm-up
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_calls or (
        time.perf_counter() - start < budget_s and len(times) < max_calls
    ):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    times.sort()
    return times[len(times) // 2], len(times)


def md_table(headers: list[str], rows: list[list[object]]) -> str:
    def fmt(v: object) -> str:
        if isinstance(v, float):
            if v == 0 or v != v:
                return "-" if v != v else "0"
            return f"{v:.3g}" if abs(v) < 1e5 else f"{v:.3e}"
        return str(v)

    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(fmt(v) for v in r) + " |" for r in rows]
    return "\n".join(out)


def command_line() -> str:
    """The command as run (with the `nice` level it ran at, if any)."""
    level = os.nice(0)
    return (
        (f"nice -n {level} " if level else "")
        + ".venv/bin/python -m "
        + Path(sys.argv[0]).stem.join(["benchmarks.", ""])
        + (" " + " ".join(sys.argv[1:]) if len(sys.argv) > 1 else "")
    )


def append_results(path: str | Path | None, title: str, body: str) -> None:
    """Append a results section (title, command, machine, body) to `path` (if given)."""
    if not path:
        return
    text = (
        f"\n## {title}\n\n"
        f"Command: `{command_line()}`  \n"
        f"Machine: {machine()}. Absolute numbers on this shared virtual machine are noisy "
        f"(medians are reported); ratios measured in the same run are the robust part. One "
        f"torch thread per process: with 2 threads on the busy 2-core machine, torch ops ran "
        f"~10x slower (threads spin waiting for each other).\n\n"
        f"{body}\n"
    )
    with open(path, "a") as f:
        f.write(text)
