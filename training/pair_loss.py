"""A loss on minimal pairs: a command and its near miss, said by the same voice in one window.

The rejection goal is missed on the near misses of a command ("app" taken for "up"), and on
the model's own training voices as much as on unheard ones (``cards/probes/split_gap.py``):
the per-frame cross-entropy sees "up" about ninety times as often as "app", from voices that
differ in everything else, so the cheap answer is the prior. A *pair window*
(``data/sc12.py``, ``WindowConfig.p_pair``) holds a command and one of its near misses from
the same voice, under the same speed change, reverb, channel, background and level; only the
words differ. This loss asks that the model's log-odds of the command against ``_unknown_``,

    d_t = z_t[c] - z_t[_unknown_]

(``z``: the per-frame class scores, ``c``: the window's command), be higher on the command's
hold frames than on the near miss's by a margin:

    loss = softplus(margin - (mean d over the command's frames - mean d over the near miss's))

averaged over the batch's pair windows. It is relative: a voice whose commands all sit low
(or high) costs nothing as long as its pair is apart, so the gradient goes to what tells the
two words apart rather than to what tells voices apart. The per-frame cross-entropy stays
beside it for the absolute decision.

:func:`pair_margin_loss_reference` is the plain loop the batched form is tested against.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class PairLossConfig:
    weight: float = 0.0  # added to the per-frame cross-entropy; 0 = off
    margin: float = 6.0  # wanted gap in log-odds (nats) between the pair's two words

    @property
    def active(self) -> bool:
        return self.weight > 0

    def check(self) -> None:
        if self.weight < 0:
            raise ValueError(f"--pair-loss-weight must be >= 0, got {self.weight}")
        if self.margin < 0:
            raise ValueError(f"--pair-margin must be >= 0, got {self.margin}")


def pair_gaps(
    logits: torch.Tensor, targets: torch.Tensor, pair_cmd: torch.Tensor, unknown: int
) -> torch.Tensor:
    """Each pair window's gap (P,): mean log-odds of its command over the command's target
    frames minus the same over its ``_unknown_`` frames.

    logits (B, F, C), targets (B, F), pair_cmd (B,): the window's command label, -1 for a
    window that is not a pair. Windows whose two words do not both have target frames (the
    second word cut by the window's end) are left out."""
    sel = pair_cmd >= 0  # (B,)
    lg, t, c = logits[sel], targets[sel], pair_cmd[sel]  # (P, F, C), (P, F), (P,)
    cmd_score = lg.gather(-1, c[:, None, None].expand(-1, lg.shape[1], 1)).squeeze(-1)
    d = cmd_score - lg[..., unknown]  # (P, F)
    on_cmd = (t == c[:, None]).to(d.dtype)  # (P, F)
    on_near = (t == unknown).to(d.dtype)
    n_cmd, n_near = on_cmd.sum(1), on_near.sum(1)  # (P,)
    ok = (n_cmd > 0) & (n_near > 0)
    gap = (d * on_cmd).sum(1) / n_cmd.clamp(min=1) - (d * on_near).sum(1) / n_near.clamp(min=1)
    return gap[ok]


def pair_margin_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    pair_cmd: torch.Tensor,
    unknown: int,
    margin: float,
) -> torch.Tensor:
    """The mean of softplus(margin - gap) over the batch's pair windows (0 when it has none)."""
    dtype = torch.promote_types(logits.dtype, torch.float32)  # (float64 stays float64)
    return margin_loss(pair_gaps(logits.to(dtype), targets, pair_cmd, unknown), margin)


def margin_loss(gap: torch.Tensor, margin: float) -> torch.Tensor:
    """The mean of softplus(margin - gap) over the gaps (P,) of :func:`pair_gaps` (0 with a
    graph when there are none), for a caller that also reports the gaps."""
    if gap.numel() == 0:
        return gap.sum() * 0.0  # (keeps the graph; no pair in this batch)
    return F.softplus(margin - gap).mean()


def pair_margin_loss_reference(
    logits: torch.Tensor,
    targets: torch.Tensor,
    pair_cmd: torch.Tensor,
    unknown: int,
    margin: float,
) -> torch.Tensor:
    """:func:`pair_margin_loss` as a plain loop over windows and frames."""
    losses = []
    for b in range(logits.shape[0]):
        c = int(pair_cmd[b])
        if c < 0:
            continue
        cmd_d, near_d = [], []
        for f in range(logits.shape[1]):
            d = logits[b, f, c].double() - logits[b, f, unknown].double()
            if int(targets[b, f]) == c:
                cmd_d.append(d)
            elif int(targets[b, f]) == unknown:
                near_d.append(d)
        if cmd_d and near_d:
            gap = sum(cmd_d) / len(cmd_d) - sum(near_d) / len(near_d)
            losses.append(torch.log1p(torch.exp(margin - gap)))
    if not losses:
        return torch.zeros((), dtype=torch.float64)
    return sum(losses) / len(losses)
