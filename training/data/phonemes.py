"""Phoneme spellings of the corpus words, for the keyword spotter's auxiliary phoneme loss.

Every clip of the corpus says one known English word (a command or an ``_unknown_`` word of
``vocab.py``; the accented voices read a respelling, but the word is the English one). Its
phonemes are espeak-ng's General American IPA (``espeak-ng -v en-us -q --ipa=1 --sep=_``) with
the stress marks removed: ``down`` -> ``d aʊ n``, ``dawn`` -> ``d ɔː n``. One pronunciation per
word, whatever voice said it: the target says which word it was in units that recur across
hundreds of words and every voice (``training/phoneme_loss.py``).

The table is generated once and kept in the repo (``phonemes_en_us.json``), so training does not
depend on the installed espeak-ng's version; ``python -m training.data.phonemes --write``
regenerates it, and the tests check that it covers every corpus word and matches espeak-ng where
espeak-ng is installed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from training.data.labels import SC10_LABELS
from training.data.vocab import unknown_words

TABLE_PATH = Path(__file__).with_name("phonemes_en_us.json")
ESPEAK_VOICE = "en-us"
STRESS = "ˈˌ"  # IPA primary and secondary stress marks (dropped)
BLANK = 0  # the CTC blank's index; phoneme k of the inventory is index k + 1


def corpus_words() -> tuple[str, ...]:
    """Every word a corpus clip can say: the ten commands, then the unknown words."""
    return tuple(dict.fromkeys([*SC10_LABELS, *unknown_words()]))


def espeak_phonemes(word: str, voice: str = ESPEAK_VOICE) -> tuple[str, ...]:
    """espeak-ng's IPA phonemes of `word`, stress marks removed."""
    out = subprocess.run(
        ["espeak-ng", "-v", voice, "-q", "--ipa=1", "--sep=_", word],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    phones = [p.strip(STRESS + " ") for chunk in out.split() for p in chunk.split("_")]
    return tuple(p for p in phones if p)


def build_table(words: Iterable[str], voice: str = ESPEAK_VOICE) -> dict[str, list[str]]:
    """word -> phonemes for `words`, in their order (needs espeak-ng)."""
    if shutil.which("espeak-ng") is None:
        raise RuntimeError("espeak-ng is not installed (scripts/setup.sh installs it)")
    return {w: list(espeak_phonemes(w, voice)) for w in words}


@dataclass(frozen=True)
class PhonemeTable:
    """Words' phoneme ids (1..len(inventory); 0 is the CTC blank)."""

    inventory: tuple[str, ...]  # sorted phoneme symbols
    words: dict[str, tuple[int, ...]]

    @classmethod
    def from_spellings(cls, spellings: dict[str, Sequence[str]]) -> PhonemeTable:
        inventory = tuple(sorted({p for ps in spellings.values() for p in ps}))
        index = {p: k + 1 for k, p in enumerate(inventory)}
        return cls(inventory, {w: tuple(index[p] for p in ps) for w, ps in spellings.items()})

    @property
    def n_classes(self) -> int:
        """Output size of a CTC head: the phonemes and the blank."""
        return len(self.inventory) + 1

    def encode(self, word: str) -> tuple[int, ...]:
        if word not in self.words:
            raise KeyError(f"no phonemes for {word!r}: regenerate {TABLE_PATH.name}")
        return self.words[word]

    def spell(self, ids: Iterable[int]) -> list[str]:
        """Phoneme symbols of ids (the blank is skipped)."""
        return [self.inventory[i - 1] for i in ids if i != BLANK]


@lru_cache(maxsize=1)
def load_table(path: Path = TABLE_PATH) -> PhonemeTable:
    data = json.loads(Path(path).read_text())
    return PhonemeTable.from_spellings({w: ps.split() for w, ps in data["words"].items()})


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true", help=f"regenerate {TABLE_PATH.name}")
    ap.add_argument("--out", type=Path, default=TABLE_PATH)
    args = ap.parse_args(argv)
    if not args.write:
        table = load_table()
        print(f"{len(table.words)} words, {len(table.inventory)} phonemes:")
        print(" ".join(table.inventory))
        return
    spellings = build_table(corpus_words())
    version = subprocess.run(["espeak-ng", "--version"], capture_output=True, text=True).stdout
    source = f"{version.split(' Data at')[0].strip()}, -v {ESPEAK_VOICE} --ipa=1, stress removed"
    # one word a line: "word": "p h o n e m e s"
    lines = ",\n".join(
        f"  {json.dumps(w)}: {json.dumps(' '.join(ps), ensure_ascii=False)}"
        for w, ps in spellings.items()
    )
    args.out.write_text(f'{{\n "source": {json.dumps(source)},\n "words": {{\n{lines}\n }}\n}}\n')
    print(f"wrote {args.out}: {len(spellings)} words")


if __name__ == "__main__":
    main()
