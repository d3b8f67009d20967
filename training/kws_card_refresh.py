"""Rewrite the notes and the command list of a speech model card, without its run directory.

    python -m training.kws_card_refresh models/speech-commands \\
        --notes training/cards/speech-commands-notes.md \\
        --commands training/cards/speech-commands-commands.txt

``training.kws_card`` writes MODEL.md from the run's own records (``summary.json``), which live
under ``runs/`` and do not outlive the machine that trained the model. The two parts of the card
that change after it ships, the notes (what was tried since) and the commands behind their
figures, are verbatim copies of two files; this module puts the files' current text in their
place and leaves every other line as ``kws_card`` wrote it, so the result equals what
``kws_card`` would write from the same run with the new files (``tests/training``).

Where they sit in a card: the notes are the text between the goals table and ``## Data``; the
commands are the lines of the ``## Commands`` block after the corpus and training lines and
before the closing ``python -m training.kws_card`` line.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

GOALS = "## Goals\n\n"
DATA = "\n\n## Data\n"
COMMANDS = "## Commands\n\n```\n"
HEAD_LINES = 2  # the corpus command and the training command
CARD_LINE = "python -m training.kws_card "


class CardLayoutError(ValueError):
    """The text does not have the layout ``training.kws_card`` writes."""


@dataclass(frozen=True)
class CardParts:
    """The two replaceable parts of a card, as character spans of its text."""

    notes: tuple[int, int]  # [start, end) of the notes
    commands: tuple[int, int]  # [start, end) of the lines between the head and the card line


def locate(text: str) -> CardParts:
    """Where the notes and the commands sit in ``text``; ``CardLayoutError`` if it is no card."""
    start = text.find(GOALS)
    if start < 0:
        raise CardLayoutError(f"no {GOALS.strip()!r} section")
    # the goals table ends at the first blank line after the heading
    table_end = text.find("\n\n", start + len(GOALS))
    notes_end = text.find(DATA, table_end) if table_end >= 0 else -1
    if notes_end < 0:
        raise CardLayoutError("no goals table followed by a '## Data' section")
    block = text.find(COMMANDS, notes_end)
    if block < 0:
        raise CardLayoutError(f"no {COMMANDS.splitlines()[0]!r} block after the notes")
    body_start = block + len(COMMANDS)
    body_end = text.find("\n```", body_start)
    if body_end < 0:
        raise CardLayoutError("the commands block is not closed")
    lines = text[body_start:body_end].split("\n")
    if len(lines) < HEAD_LINES + 1 or not lines[-1].startswith(CARD_LINE):
        raise CardLayoutError(f"the commands block does not end with {CARD_LINE.strip()!r}")
    cmd_start = body_start + sum(len(line) + 1 for line in lines[:HEAD_LINES])
    cmd_end = body_end - len(lines[-1]) - 1
    return CardParts(notes=(table_end + 2, notes_end), commands=(cmd_start, cmd_end))


def refresh(text: str, notes: str, commands: str) -> str:
    """``text`` (a MODEL.md by ``kws_card``) with ``notes`` and ``commands`` put in place."""
    parts = locate(text)
    (n0, n1), (c0, c1) = parts.notes, parts.commands
    return f"{text[:n0]}{notes.strip()}{text[n1:c0]}{commands.strip()}{text[c1:]}"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model_dir", type=Path, help="the model directory whose MODEL.md is rewritten")
    p.add_argument("--notes", type=Path, required=True, help="markdown: what misses and why")
    p.add_argument("--commands", type=Path, required=True, help="the commands behind the figures")
    args = p.parse_args(argv)
    card = args.model_dir / "MODEL.md"
    try:
        text = refresh(card.read_text(), args.notes.read_text(), args.commands.read_text())
    except (OSError, CardLayoutError) as e:
        p.error(f"{card}: {e}")
    card.write_text(text)
    print(card)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
