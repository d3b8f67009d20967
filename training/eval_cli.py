"""`dlr-eval`: rerunnable evaluations of shipped models.

    dlr-eval speech models/speech-commands                 # clips, rejection, 1 h of streams
    dlr-eval speech runs/kws_loso-flite/model --stream-minutes 0   # one LOSO fold: clips only
    dlr-eval loso runs/kws_loso-espeak/model runs/kws_loso-flite/model ... --out table.md

`speech` options are `training.eval_speech.EvalOptions` (tyro: field comments are the help);
`loso` reads each fold's eval.json (running `speech` on it first if missing) and prints the
leave-one-synthesizer-out table in Markdown.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import tyro

from training.cli import FLAT
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


@dataclasses.dataclass
class SpeechArgs:
    """Evaluate one keyword-spotting checkpoint."""

    model_dir: Annotated[
        str,
        tyro.conf.Positional,
        tyro.conf.arg(metavar="MODEL_DIR", help="the model folder (checkpoint + metadata)"),
    ]
    eval: EvalOptions


@dataclasses.dataclass
class LosoArgs:
    """Leave-one-synthesizer-out table from fold checkpoints."""

    model_dirs: Annotated[
        tuple[str, ...],
        tyro.conf.Positional,
        tyro.conf.arg(metavar="MODEL_DIR...", help="one model folder per held-out engine"),
    ]
    eval: EvalOptions
    table: str = ""  # also write the table to this file


Command = (
    Annotated[SpeechArgs, tyro.conf.subcommand("speech")]
    | Annotated[
        LosoArgs,
        tyro.conf.subcommand(
            "loso",
            default=LosoArgs((), EvalOptions(stream_minutes=0.0, valid_stream_minutes=0.0)),
        ),
    ]
)


def main(argv: Sequence[str] | None = None) -> int:
    args = tyro.cli(
        Command,
        args=None if argv is None else list(argv),
        prog="dlr-eval",
        description=__doc__.splitlines()[0],
        config=FLAT,
    )
    match args:
        case SpeechArgs(model_dir=model_dir, eval=opts):
            res = evaluate(model_dir, opts)
            brief = {k: res[k] for k in ("split", "silence") if k in res}
            for kind in ("clean", "augmented"):
                brief[kind] = {k: v for k, v in res[kind].items() if k not in ("per_voice",)}
            if "streams" in res:
                st = res["streams"]
                brief["streams"] = {k: v for k, v in st.items() if k not in ("valid", "test")}
                brief["streams"]["intervals"] = {
                    n: st[n].get("intervals") for n in ("valid", "test")
                }
            print(json.dumps(brief, indent=1))
        case LosoArgs(model_dirs=model_dirs, eval=opts, table=out):
            if not model_dirs:
                print("dlr-eval loso: error: give one model folder per fold", file=sys.stderr)
                return 2
            table = loso_table(model_dirs, opts)
            print(table)
            if out:
                Path(out).write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
