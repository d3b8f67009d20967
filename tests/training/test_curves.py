"""curves.png draws the held-out metrics a run reported, and skips those it did not."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

from training import metrics  # noqa: E402


def test_only_reported_metrics_get_a_line(tmp_path: Path, monkeypatch) -> None:
    import matplotlib.pyplot as plt

    drawn: list[str] = []
    real = plt.Axes.plot

    def spy(ax, *args, label=None, **kw):
        drawn.append(label)
        return real(ax, *args, label=label, **kw)

    monkeypatch.setattr(plt.Axes, "plot", spy)
    records = [
        {"kind": "train", "step": 1, "loss": 1.0},
        {"kind": "eval", "step": 2, "loss": 0.9, "accuracy": 0.5, "context_accuracy": 0.4},
    ]
    metrics.plot_curves(records, tmp_path / "a.png", metrics=["accuracy", "context_accuracy"])
    assert {"accuracy", "context_accuracy"} <= set(drawn)
    drawn.clear()
    records[1].pop("context_accuracy")  # a run with the context metric off
    metrics.plot_curves(records, tmp_path / "b.png", metrics=["accuracy", "context_accuracy"])
    assert "accuracy" in drawn and "context_accuracy" not in drawn
    assert (tmp_path / "b.png").stat().st_size > 0
