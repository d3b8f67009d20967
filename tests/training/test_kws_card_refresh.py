"""The card refresh: notes and commands replaced in place, every other line kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from training.kws_card_refresh import CardLayoutError, locate, main, refresh

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "speech-commands" / "MODEL.md"


def parts(text: str) -> tuple[str, str]:
    p = locate(text)
    return text[slice(*p.notes)], text[slice(*p.commands)]


def test_shipped_card_round_trips() -> None:
    card = SHIPPED.read_text()
    notes, commands = parts(card)
    assert notes.startswith("## What misses") and "## Data" not in notes and "## Goals" not in notes
    assert commands.startswith("python -m training.route ") and "```" not in commands
    assert refresh(card, notes, commands) == card


def test_refresh_replaces_only_the_two_parts() -> None:
    card = SHIPPED.read_text()
    new = refresh(card, "\n- **New.** A note.\n\n", "dlr-eval speech A\nsecond   # two\n")
    assert parts(new) == ("- **New.** A note.", "dlr-eval speech A\nsecond   # two")
    (n0, n1), (c0, c1) = locate(card).notes, locate(card).commands
    (m0, m1), (d0, d1) = locate(new).notes, locate(new).commands
    assert new[:m0] == card[:n0] and new[m1:d0] == card[n1:c0] and new[d1:] == card[c1:]
    block = new.split("## Commands\n\n```\n")[1].split("\n```")[0].splitlines()
    assert block[2:4] == ["dlr-eval speech A", "second   # two"]
    assert block[-1].startswith("python -m training.kws_card ")


def test_empty_notes_keep_the_layout() -> None:
    card = refresh(SHIPPED.read_text(), "", "x")
    assert parts(card) == ("", "x") and "\n\n\n\n## Data\n" in card
    assert parts(refresh(card, "y", "z")) == ("y", "z")


@pytest.mark.parametrize(
    "text",
    [
        "# no card\n",
        "## Goals\n\n| a |\n\nnotes but no data section\n",
        "## Goals\n\n| a |\n\nn\n\n## Data\nno commands\n",
        "## Goals\n\n| a |\n\nn\n\n## Data\n## Commands\n\n```\na\nb\nc\n",
        "## Goals\n\n| a |\n\nn\n\n## Data\n## Commands\n\n```\na\nb\nnot the card line\n```\n",
    ],
)
def test_refuses_text_that_is_no_card(text: str) -> None:
    with pytest.raises(CardLayoutError):
        refresh(text, "n", "c")


def test_cli_rewrites_the_card(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "MODEL.md").write_text(SHIPPED.read_text())
    notes, commands = tmp_path / "notes.md", tmp_path / "commands.txt"
    notes.write_text("- **Tried.** One thing.\n")
    commands.write_text("one\ntwo\n")
    assert main([str(model), "--notes", str(notes), "--commands", str(commands)]) == 0
    assert parts((model / "MODEL.md").read_text()) == ("- **Tried.** One thing.", "one\ntwo")
    (model / "MODEL.md").write_text("not a card\n")
    with pytest.raises(SystemExit) as e:
        main([str(model), "--notes", str(notes), "--commands", str(commands)])
    assert e.value.code == 2 and "no '## Goals' section" in capsys.readouterr().err
    assert (model / "MODEL.md").read_text() == "not a card\n"  # left as it was
