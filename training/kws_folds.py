"""Leave-one-synthesizer-out folds as the speech model card shows them: one record per fold run
(its evaluation of the unheard engine, and the training route it descends from), kept in a JSON
file so the card's table outlives the runs, and the card section built from them."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from training.model_card import pct
from training.trainer import MODEL_DIR


@dataclass(frozen=True)
class FoldRecord:
    """What the card shows of one leave-one-synthesizer-out fold run."""

    run: str  # the fold's run directory name
    engine: str  # the engine held out
    clean_commands: float  # its commands on clean clips given their label
    augmented_commands: float
    unknown_accepted: float  # its clean unknown-word clips called a command
    silence_accepted: float  # word-less windows called a command
    steps: int  # from scratch: its own and those of the runs it was fine-tuned from
    train_minutes: float  # the same, in training minutes
    test_voices: int


def route(run: Path) -> list[dict[str, Any]]:
    """The summaries of `run` and of the runs it descends from (`--init-from`, or the start of
    a weight average), newest first; the chain ends at a start that is not a run directory."""
    chain: list[dict[str, Any]] = []
    seen: set[Path] = set()
    at: Path | None = run
    while at is not None and (at / "summary.json").is_file() and at.resolve() not in seen:
        seen.add(at.resolve())
        summ = json.loads((at / "summary.json").read_text())
        chain.append(summ)
        start = summ.get("train", {}).get("init_from")
        at = Path(start).parent if start else None
    return chain


def loso_records(loso: list[Path], checkpoint: str = MODEL_DIR) -> list[FoldRecord]:
    """One record per fold run directory (the eval.json of its ``checkpoint``, ``model`` =
    the kept one or ``last``, and the summary.json of it and of the runs it was fine-tuned
    from)."""
    out = []
    for run in loso:
        ev = json.loads((run / checkpoint / "eval" / "eval.json").read_text())
        chain = route(run)
        out.append(
            FoldRecord(
                run=run.name,
                engine=ev["split"].removeprefix("loso-"),
                clean_commands=ev["clean"]["command_accuracy"],
                augmented_commands=ev["augmented"]["command_accuracy"],
                unknown_accepted=ev["clean"]["unknown_accepted"],
                silence_accepted=ev["silence"]["accepted_argmax"],
                steps=sum(int(c["steps"]) for c in chain),
                train_minutes=sum(float(c["train_time_s"]) for c in chain) / 60,
                test_voices=len(ev["test_voices"]),
            )
        )
    return out


def save_folds(records: list[FoldRecord], path: Path) -> None:
    path.write_text(json.dumps({"folds": [asdict(r) for r in records]}, indent=1) + "\n")


def load_folds(path: Path) -> list[FoldRecord]:
    return [FoldRecord(**f) for f in json.loads(path.read_text())["folds"]]


def loso_section(records: list[FoldRecord]) -> str:
    """The body of the card's section "Leave one synthesizer out"."""
    if not records:
        return "(not run)"
    return f"""Runs of the same architecture ({"; ".join(r.run for r in records)}; their training
from scratch in the last rows), each trained without one engine *and* without every speaker
that engine shares (festival kal/slt when flite is held out, flite kal/kal16/slt when festival
is held out; RHVoice's alan and slt go with flite's awb and slt), tested on all voices of that
engine (for festival: its English and its accented voices; for kokoro: its five voices and the
mixes):

{_loso_rows(records)}"""


def _loso_rows(records: list[FoldRecord]) -> str:
    head = (
        "| | "
        + " | ".join(f"train without **{r.engine}**, test on {r.engine}" for r in records)
        + " |"
    )
    lines = [head, "|---" * (len(records) + 1) + "|"]
    rows = [
        ("commands, clean clips", [r.clean_commands for r in records]),
        ("commands, augmented clips", [r.augmented_commands for r in records]),
        ("unknown accepted (clean)", [r.unknown_accepted for r in records]),
        ("silence accepted", [r.silence_accepted for r in records]),
    ]
    for title, values in rows:
        lines.append(f"| {title} | " + " | ".join(pct(v) for v in values) + " |")
    lines.append(
        "| training steps from scratch (minutes) | "
        + " | ".join(f"{r.steps} ({r.train_minutes:.0f})" for r in records)
        + " |"
    )
    lines.append("| test voices | " + " | ".join(str(r.test_voices) for r in records) + " |")
    return "\n".join(lines)
