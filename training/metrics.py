"""Metrics of a run: one JSON line per record, a CSV copy and a PNG of the learning curves.

Records are dicts with a "kind" ("train" or "eval"), the step, and numbers. The JSONL file is
appended as the run goes (so a resumed run continues it); `finish` writes `metrics.csv` and
`curves.png` from the whole file.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any


class MetricsLog:
    """Append-only JSONL metrics file in a run directory."""

    def __init__(self, out_dir: str | Path, enabled: bool = True) -> None:
        self.dir = Path(out_dir)
        self.path = self.dir / "metrics.jsonl"
        self.enabled = enabled

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")

    def truncate_after(self, step: int) -> None:
        """Drop records past `step` (written after the state a resumed run restarts from)."""
        if not self.enabled or not self.path.exists():
            return
        kept = [r for r in self.read() if r.get("step", 0) <= step]
        self.path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def finish(self, title: str = "", metrics: list[str] | None = None) -> None:
        """Write metrics.csv and curves.png (held-out `metrics` on the right) from the log."""
        if not self.enabled:
            return
        records = self.read()
        if not records:
            return
        write_csv(records, self.dir / "metrics.csv")
        plot_curves(records, self.dir / "curves.png", title, metrics)


def write_csv(records: list[dict[str, Any]], path: Path) -> None:
    columns = sorted({k for r in records for k in r}, key=lambda k: (k not in ("kind", "step"), k))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for r in records:
            writer.writerow(r)


def plot_curves(
    records: list[dict[str, Any]], path: Path, title: str = "", metrics: list[str] | None = None
) -> None:
    """Training loss (left) and the held-out `metrics` (right; default: all but counts)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in records if r.get("kind") == "train"]
    evals = [r for r in records if r.get("kind") == "eval"]
    fig, (ax_l, ax_r) = plt.subplots(1, 2, figsize=(11, 4))
    if train:
        ax_l.plot([r["step"] for r in train], [r["loss"] for r in train], lw=1, label="train loss")
    if evals and "loss" in evals[0]:
        ax_l.plot(
            [r["step"] for r in evals], [r["loss"] for r in evals], "o-", label="held-out loss"
        )
    ax_l.set_xlabel("step")
    ax_l.set_ylabel("loss")
    ax_l.legend()
    ax_l.grid(alpha=0.3)
    if metrics is None:
        found = {k for r in evals for k, v in r.items() if isinstance(v, float)}
        metrics = sorted(found - {"loss", "epoch", "elapsed_s", "step", "clips", "tokens"})
    keys = [k for k in metrics if any(k in r for r in evals)]  # those the run reported
    for key in keys:
        pts = [(r["step"], r[key]) for r in evals if key in r]
        ax_r.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=key)
    ax_r.set_xlabel("step")
    ax_r.set_ylabel("held-out " + ", ".join(keys) if keys else "held-out metric")
    if keys:
        ax_r.legend()
    ax_r.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
