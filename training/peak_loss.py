"""A loss on the keyword spotter's own decision value: the peak of the smoothed posterior.

Per-frame cross-entropy asks for the word's label on every frame of its hold span (``sc12.py``);
the detector (``dlr_runtime.kws.KeywordSpotter``) fires when the mean of the last ``k`` softmax
rows of a command reaches its threshold. A voice the model half-recognises can win the argmax
on most hold frames and still never lift that mean to the threshold. This loss scores what the
detector scores: for every run of frames carrying one word label (a command or ``_unknown_``),
the highest ``k``-frame mean of that label's posterior inside the run, and adds
``-log(peak)`` per word (the max-pooling idea of keyword-spotting training, on the smoothed
value). The gradient goes through the best window of each word only, so words the model
already says confidently cost nothing and the hard ones get the whole push.

The other side of the detector is :func:`false_peak_loss`: over every run of ``_silence_`` or
``_unknown_`` targets (a near-miss word's hold span sees the word itself through the smoothing
window), the highest smoothed posterior any command reaches costs ``-log(1 - peak)``, so the
unknown words and noise that would fire are pushed below the threshold.

``peak_span_loss_reference`` and ``false_peak_loss_reference`` are the plain loops the fast
forms are tested against.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PeakLossConfig:
    weight: float = 0.0  # added to the per-frame cross-entropy; 0 = off
    false_weight: float = 0.0  # the same for false_peak_loss; 0 = off
    smooth_frames: int = 15  # k: the detector's smoothing window in frames (300 ms at 20 ms)

    @property
    def active(self) -> bool:
        return self.weight > 0 or self.false_weight > 0

    def check(self) -> None:
        if self.weight < 0:
            raise ValueError(f"--peak-loss-weight must be >= 0, got {self.weight}")
        if self.false_weight < 0:
            raise ValueError(f"--false-peak-loss-weight must be >= 0, got {self.false_weight}")
        if self.smooth_frames < 1:
            raise ValueError(f"--peak-smooth-frames must be >= 1, got {self.smooth_frames}")


def span_index(targets: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Targets (B, F) -> the run of each frame (B, F) (-1 outside) and each run's label (S,).

    A run is a stretch of one row whose frames all carry the same label of ``labels``; runs are
    numbered row by row, in time order."""
    inside = torch.isin(targets, labels.to(targets.device))  # (B, F)
    start = inside.clone()
    start[:, 1:] &= targets[:, 1:] != targets[:, :-1]  # a frame after its own label continues
    ids = torch.cumsum(start.flatten(), 0).view_as(targets) - 1
    return torch.where(inside, ids, -1), targets[start]


def smoothed(probs: torch.Tensor, k: int) -> torch.Tensor:
    """(B, F, C) posteriors -> mean of the last ``k`` frames at each frame (fewer at the start)."""
    c = torch.cumsum(probs, dim=1)  # (B, F, C)
    lagged = torch.cat([torch.zeros_like(c[:, :k]), c[:, :-k]], dim=1)[:, : c.shape[1]]
    n = torch.arange(1, probs.shape[1] + 1, device=probs.device).clamp(max=k)  # (F,)
    return (c - lagged) / n.to(probs.dtype)[None, :, None]


def smoothed_softmax(logits: torch.Tensor, k: int) -> torch.Tensor:
    """(B, F, C) scores -> the detector's smoothed posteriors (float32 or wider); both losses
    take these, so a batch computes them once."""
    dtype = torch.promote_types(logits.dtype, torch.float32)
    return smoothed(torch.softmax(logits, dim=-1, dtype=dtype), k)


def _run_max(values: torch.Tensor, ids: torch.Tensor, n: int) -> torch.Tensor:
    """Per-frame values (B, F) -> their maximum over each of the ``n`` runs of ``ids`` (n,)."""
    inside = ids >= 0
    out = values.new_zeros(n)
    return out.scatter_reduce(0, ids[inside], values[inside], "amax", include_self=False)


def peak_span_loss(
    sm: torch.Tensor, targets: torch.Tensor, word_labels: torch.Tensor
) -> torch.Tensor:
    """Mean over the words of a batch of ``-log`` the peak smoothed posterior of their label.

    sm (B, F, C) from :func:`smoothed_softmax`, targets (B, F) (``IGNORE`` and silence frames
    carry no word). A batch without words gives 0 (connected to the graph)."""
    ids, labels = span_index(targets, word_labels)
    if not len(labels):
        return sm.sum() * 0.0
    own = sm.gather(-1, targets.clamp(0, sm.shape[-1] - 1).unsqueeze(-1)).squeeze(-1)  # (B, F)
    peaks = _run_max(own, ids, len(labels))
    return -torch.log(peaks.clamp_min(1e-8)).mean()


def false_peak_loss(
    sm: torch.Tensor,
    targets: torch.Tensor,
    reject_labels: torch.Tensor,
    command_labels: torch.Tensor,
) -> torch.Tensor:
    """Mean over the runs of ``reject_labels`` targets of ``-log(1 - peak)``, the peak being the
    highest smoothed posterior (sm (B, F, C)) of any of ``command_labels`` inside the run. 0
    without runs."""
    ids, labels = span_index(targets, reject_labels)
    if not len(labels):
        return sm.sum() * 0.0
    top = sm[..., command_labels.to(sm.device)].amax(-1)  # (B, F)
    peaks = _run_max(top, ids, len(labels))
    return -torch.log((1 - peaks).clamp_min(1e-8)).mean()


def _runs(targets: torch.Tensor, labels: list[int]) -> list[tuple[int, int, int, int]]:
    """(row, start, end, label) of the runs of equal targets in ``labels``, frame by frame."""
    out = []
    for b in range(targets.shape[0]):
        f = 0
        while f < targets.shape[1]:
            label = int(targets[b, f])
            if label not in labels:
                f += 1
                continue
            end = f
            while end < targets.shape[1] and int(targets[b, end]) == label:
                end += 1
            out.append((b, f, end, label))
            f = end
    return out


def _window_mean(probs: torch.Tensor, b: int, t: int, c: int, k: int) -> float:
    lo = max(0, t - k + 1)
    return float(sum(probs[b, i, c] for i in range(lo, t + 1))) / (t + 1 - lo)


def false_peak_loss_reference(
    logits: torch.Tensor,
    targets: torch.Tensor,
    reject_labels: list[int],
    command_labels: list[int],
    k: int,
) -> torch.Tensor:
    """The same, one frame, command and run at a time (float64)."""
    probs = torch.softmax(logits.double(), dim=-1)
    losses = []
    for b, start, end, _ in _runs(targets, reject_labels):
        best = max(
            _window_mean(probs, b, t, c, k) for t in range(start, end) for c in command_labels
        )
        losses.append(-torch.log(torch.tensor(max(1 - best, 1e-8), dtype=torch.float64)))
    return torch.stack(losses).mean() if losses else torch.tensor(0.0, dtype=torch.float64)


def peak_span_loss_reference(
    logits: torch.Tensor, targets: torch.Tensor, word_labels: list[int], k: int
) -> torch.Tensor:
    """The same, one frame and one word at a time (float64)."""
    probs = torch.softmax(logits.double(), dim=-1)
    losses = []
    for b, start, end, label in _runs(targets, word_labels):
        best = max(_window_mean(probs, b, t, label, k) for t in range(start, end))
        losses.append(-torch.log(torch.tensor(max(best, 1e-8), dtype=torch.float64)))
    return torch.stack(losses).mean() if losses else torch.tensor(0.0, dtype=torch.float64)
