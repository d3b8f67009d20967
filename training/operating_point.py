"""Detection operating points, chosen on the *valid* streams (never on test).

Two rules, both scored with the one decision rule (``dlr_runtime.kws.KeywordSpotter``):

- **global**: the lowest shared threshold whose false accepts per hour are <= the target;
- **per command**: each command gets its own threshold (``KWSConfig.keywords``). A sweep over
  shared thresholds counts, per command and threshold, the commands of that label detected
  and the false accepts carrying that label. An exact dynamic programme over the false-accept
  budget (``target x hours``, whole detections) picks the thresholds that detect the most
  commands in total; ties go to fewer false accepts, then to higher thresholds. Commands
  interact a little in the real rule (the refractory period, the strongest of several hot
  commands wins), so the chosen thresholds are scored together on the valid streams and the
  budget shrinks until the joint count meets the target. A command whose words rarely
  trigger false accepts can thus sit lower than a confusable one (``down`` next to "dawn").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from dlr_runtime.kws import KWSConfig
from training.streams import StreamScore


@dataclass(frozen=True)
class ChosenPoint:
    """An operating point and what it scored on the streams that chose it."""

    config: KWSConfig
    valid: StreamScore
    rule: str  # "global" | "per_command"
    budget: int  # false accepts allowed on the valid streams (per-command rule)


def global_point(sweep: Sequence[StreamScore], fa_target: float) -> StreamScore:
    """The lowest threshold of ``sweep`` at <= ``fa_target`` false accepts per hour (the
    highest threshold when none is)."""
    ok = [s for s in sweep if s.fa_per_hour <= fa_target]
    if ok:
        return min(ok, key=lambda s: s.threshold)
    return max(sweep, key=lambda s: s.threshold)


def per_command_thresholds(
    sweep: Sequence[StreamScore], commands: Sequence[str], budget: int
) -> dict[str, float]:
    """Per-command thresholds from a shared-threshold ``sweep`` that detect the most commands
    with at most ``budget`` false accepts in total (each command's highest threshold when even
    those exceed the budget)."""
    by_t = sorted(sweep, key=lambda s: -s.threshold)  # high -> low: ties keep the higher one
    # best[b]: (detected, thresholds) using exactly b false accepts so far
    best: dict[int, tuple[int, dict[str, float]]] = {0: (0, {})}
    for c in commands:
        nxt: dict[int, tuple[int, dict[str, float]]] = {}
        for b, (hits, chosen) in best.items():
            for s in by_t:
                nb = b + s.false_by_label[c]
                if nb > budget:
                    continue
                nh = hits + s.detected_by_label[c]
                if nb not in nxt or nh > nxt[nb][0]:
                    nxt[nb] = (nh, {**chosen, c: s.threshold})
        if not nxt:
            return {c: by_t[0].threshold for c in commands}
        best = nxt
    top = max(h for h, _ in best.values())
    b = min(b for b, (h, _) in best.items() if h == top)
    return best[b][1]


def choose_point(
    sweep: Sequence[StreamScore],
    base: KWSConfig,
    commands: Sequence[str],
    fa_target: float,
    scorer: Callable[[KWSConfig], StreamScore],
    per_command: bool,
) -> ChosenPoint:
    """The operating point for ``fa_target`` (valid streams): the global rule, or with
    ``per_command`` the per-command rule whenever it detects at least as many valid commands
    within the target (``scorer`` runs the decision rule over the valid streams)."""
    g = global_point(sweep, fa_target)
    glob = ChosenPoint(_with(base, g.threshold, {}), g, "global", 0)
    if not per_command or not sweep:
        return glob
    hours = sweep[0].hours
    budget = math.floor(fa_target * hours + 1e-9)
    while budget >= 0:
        th = per_command_thresholds(sweep, commands, budget)
        cfg = _with(base, g.threshold, th)
        got = scorer(cfg)
        if got.fa_per_hour <= fa_target:
            if got.detected >= g.detected:
                return ChosenPoint(cfg, got, "per_command", budget)
            return glob
        budget -= 1
    return glob


def _with(base: KWSConfig, threshold: float, keywords: dict[str, float]) -> KWSConfig:
    return KWSConfig(**{**asdict(base), "threshold": threshold, "keywords": dict(keywords)})
