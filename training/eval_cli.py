"""`dlr-eval`: rerunnable evaluations of shipped models.

    dlr-eval speech models/speech-commands                 # clips, rejection, 1 h of streams
    dlr-eval speech runs/kws_loso-flite/model --stream-minutes 0   # one LOSO fold: clips only
    dlr-eval loso runs/kws_loso-espeak/model runs/kws_loso-flite/model ... --out table.md

`speech` options mirror `training.eval_speech.EvalOptions` (field comments are the help);
`loso` reads each fold's eval.json (running `speech` on it first if missing) and prints the
leave-one-synthesizer-out table in Markdown.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from training.cli import add_dataclass_args, pick
from training.eval_speech import EvalOptions, evaluate


def loso_table(model_dirs: Sequence[str], opts: EvalOptions) -> str:
    """Markdown table: one column per held-out synthesizer (train without X, test on X)."""
    rows: dict[str, dict[str, Any]] = {}
    for d in model_dirs:
        path = Path(d) / "eval" / "eval.json"
        res = json.loads(path.read_text()) if path.exists() else evaluate(d, opts)
        held = res["split"].removeprefix("loso-")
        rows[held] = res
    cols = sorted(rows)
    lines = ["| metric | " + " | ".join(f"without {c} -> test {c}" for c in cols) + " |"]
    lines.append("|---" * (len(cols) + 1) + "|")

    def row(name: str, fn) -> None:
        lines.append(f"| {name} | " + " | ".join(fn(rows[c]) for c in cols) + " |")

    row("commands, clean clips", lambda r: f"{100 * r['clean']['command_accuracy']:.1f} %")
    row("commands, augmented clips", lambda r: f"{100 * r['augmented']['command_accuracy']:.1f} %")
    row("unknown accepted (clean)", lambda r: f"{100 * r['clean']['unknown_accepted']:.1f} %")
    row("silence accepted", lambda r: f"{100 * r['silence']['accepted_argmax']:.1f} %")
    row("test voices", lambda r: ", ".join(v.split(":", 1)[1] for v in r["test_voices"][:8]))
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dlr-eval", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    sp = sub.add_parser("speech", help="evaluate one keyword-spotting checkpoint")
    sp.add_argument("model_dir")
    add_dataclass_args(sp, EvalOptions, "evaluation")
    lp = sub.add_parser("loso", help="leave-one-synthesizer-out table from fold checkpoints")
    lp.add_argument("model_dirs", nargs="+")
    lp.add_argument("--table", default="", help="also write the table to this file")
    add_dataclass_args(lp, EvalOptions, "evaluation", stream_minutes=0.0, valid_stream_minutes=0.0)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    opts = pick(EvalOptions, args)
    if args.command == "speech":
        res = evaluate(args.model_dir, opts)
        brief = {k: res[k] for k in ("split", "silence") if k in res}
        for kind in ("clean", "augmented"):
            brief[kind] = {k: v for k, v in res[kind].items() if k not in ("per_voice",)}
        if "streams" in res:
            brief["streams"] = {
                k: v for k, v in res["streams"].items() if k not in ("valid", "test")
            }
        print(json.dumps(brief, indent=1))
        return 0
    table = loso_table(args.model_dirs, opts)
    print(table)
    if args.table:
        Path(args.table).write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
