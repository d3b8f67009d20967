"""More near misses of the commands, found in a pronouncing dictionary: training-only negatives.

``vocab.NEAR_MISSES`` holds about ten hand-picked words per command. They are where the
rejection fails: the shipped model takes about a quarter of them for a command, on its own
training voices as much as on unheard ones (``training/cards/probes/split_gap.py``), while
other words are accepted about 2 % of the time. This module finds many more such words, so
training can show the model the contrast ("app" is not "up") in hundreds of words instead of
memorising ten.

A word is a near miss of a command when its pronunciation is one phone away from the
command's (one substitution, insertion or deletion) in CMUdict, as Festival ships it
(``festlex-cmu``: ``/usr/share/festival/dicts/cmu/cmudict-0.4.out``); for the commands of
three phones or more, also two phones away with the command's vowel kept ("yes" -> "best"),
ranked after the one-phone words. It is kept when:

- it occurs in running text: the WSJ part-of-speech lexicon that Festival ships
  (``festlex-poslex``: ``wsj.wp39.poslexR``) lists it. Words with a tag other than a proper
  noun's come first, the most probable first (their log-probability under that tag), then
  names ("jess", "dan"): what matters is the sound, and some commands have few common
  neighbours;
- it is not a command, a listed homophone, or already an ``_unknown_`` word of ``vocab.py``
  (those stay in the evaluation; this list is for training only);
- it does not become a homophone under the vowel mergers of American English: "aa" and "ao"
  ("cot" / "caught") and the reduced "ax" and "ah" count as one vowel before the distance is
  taken;
- espeak-ng (``en-us``, the engine with the most voices here) does not pronounce it as the
  command either (stress removed, the same mergers).

The list is generated once and kept in the repo (``near_misses_cmudict.json``: command ->
words, best first), so training does not depend on the installed dictionaries;
``python -m training.data.near_misses --write`` regenerates it, and the tests check it against
the dictionaries where they are installed.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path

from training.data.labels import SC10_LABELS
from training.data.vocab import HOMOPHONES, unknown_words

LIST_PATH = Path(__file__).with_name("near_misses_cmudict.json")
CMUDICT = Path("/usr/share/festival/dicts/cmu/cmudict-0.4.out")
POSLEX = Path("/usr/share/festival/dicts/wsj.wp39.poslexR")
PER_COMMAND = 30  # words kept per command
PROPER_TAGS = frozenset({"nnp", "nnps"})
#: CMUdict (Festival's phone set) vowels that count as one before the distance is taken.
CMU_MERGE = {"ao": "aa", "ax": "ah"}
#: The same for espeak-ng's IPA (stress removed): cot / caught, and length marks.
IPA_MERGE = {"ɔ": "ɑ", "ə": "ʌ", "ː": ""}

_ENTRY = re.compile(r'^\("([^"]+)" (\S+) (.*)\)\s*$')


def parse_cmudict(lines: Iterable[str]) -> dict[str, list[tuple[str, ...]]]:
    """Festival's CMUdict lines -> word -> its pronunciations (phones, stress dropped)."""
    out: dict[str, list[tuple[str, ...]]] = {}
    for line in lines:
        m = _ENTRY.match(line)
        if not m:
            continue
        phones = tuple(re.findall(r"[a-z]+", re.sub(r"\b\d\b", "", m.group(3))))
        out.setdefault(m.group(1), []).append(phones)
    return out


def parse_poslex(lines: Iterable[str]) -> dict[str, tuple[int, float]]:
    """Festival's WSJ POS lexicon -> word -> (tier, score), the best first when sorted: tier 0
    for a word with a tag other than a proper noun's (score: minus its best log-probability
    under such a tag), tier 1 for a word tagged only as a name."""
    out: dict[str, tuple[int, float]] = {}
    for line in lines:
        m = re.match(r'^\("([^"]+)" \((.*)\) \(\) \)\s*$', line)
        if not m:
            continue
        tags = [(t, float(s)) for t, s in re.findall(r"\((\S+) (-?[\d.]+)\)", m.group(2))]
        common = [s for t, s in tags if t not in PROPER_TAGS]
        if common:
            out[m.group(1)] = (0, -max(common))
        elif tags:
            out[m.group(1)] = (1, -max(s for _, s in tags))
    return out


def edit_distance(a: Sequence[str], b: Sequence[str]) -> int:
    """Levenshtein distance of two phone sequences."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        diag, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            diag, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diag + (x != y))
    return row[-1]


def merged(phones: Sequence[str], table: dict[str, str]) -> tuple[str, ...]:
    """Phones with the merged vowels replaced (and emptied marks dropped)."""
    out = []
    for p in phones:
        for k, v in table.items():
            p = p.replace(k, v)
        if p:
            out.append(p)
    return tuple(out)


def _vowels(phones: Sequence[str]) -> tuple[str, ...]:
    return tuple(p for p in phones if p[0] in "aeiou")


def candidates(
    prons: dict[str, list[tuple[str, ...]]],
    freq: dict[str, tuple[int, float]],
    per_command: int = PER_COMMAND,
) -> dict[str, list[str]]:
    """Command -> up to `per_command` dictionary words near it, best first: one phone away
    (none at zero after the mergers), then, for commands of three phones or more, two phones
    away with the command's vowel kept ("yes" -> "best"); in each, common words before names
    and frequent before rare. Each word goes to the first command it is near."""
    excluded = set(SC10_LABELS) | HOMOPHONES | set(unknown_words())
    cmd_prons = {c: [merged(p, CMU_MERGE) for p in prons[c]] for c in SC10_LABELS}
    long_cmds = {c for c, ps in cmd_prons.items() if min(len(q) for q in ps) >= 3}
    ranked: dict[str, list[tuple[tuple[int, int, float], str]]] = {c: [] for c in SC10_LABELS}
    for word in sorted(freq, key=lambda w: (*freq[w], w)):
        if word in excluded or not re.fullmatch(r"[a-z]{2,}", word) or word not in prons:
            continue
        mine = [merged(p, CMU_MERGE) for p in prons[word]]
        dists = {
            c: min(edit_distance(p, q) for p in mine for q in cmd_prons[c]) for c in SC10_LABELS
        }
        nearest = min(dists.values())
        if nearest == 0 or nearest > 2:
            continue  # a homophone of some command under the mergers, or far from all
        for c in SC10_LABELS:
            if dists[c] != nearest:
                continue
            if nearest == 2 and not (
                c in long_cmds and any(_vowels(p) == _vowels(q) for p in mine for q in cmd_prons[c])
            ):
                continue
            ranked[c].append(((nearest, *freq[word]), word))
            break
    return {c: [w for _, w in sorted(r)[:per_command]] for c, r in ranked.items()}


def espeak_ipa(words: Sequence[str]) -> list[tuple[str, ...]]:
    """espeak-ng's en-us phonemes of each word (IPA, stress removed), one call for all."""
    out = subprocess.run(
        ["espeak-ng", "-v", "en-us", "-q", "--ipa=1", "--sep=_"],
        input="\n".join(words) + "\n",
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    lines = [ln.strip() for ln in out if ln.strip()]
    if len(lines) != len(words):
        raise RuntimeError(f"espeak-ng gave {len(lines)} lines for {len(words)} words")
    return [tuple(p for p in re.sub("[ˈˌ]", "", ln).split("_") if p) for ln in lines]


def espeak_homophones(near: dict[str, list[str]]) -> set[str]:
    """The words espeak-ng pronounces as some command (after the mergers)."""
    words = [w for ws in near.values() for w in ws]
    ipa = dict(zip(words, espeak_ipa(words), strict=True))
    cmds = {merged(p, IPA_MERGE) for p in espeak_ipa(list(SC10_LABELS))}
    return {w for w, p in ipa.items() if merged(p, IPA_MERGE) in cmds}


def from_dictionaries(per_command: int = PER_COMMAND) -> dict[str, list[str]]:
    """The list from the installed dictionaries and espeak-ng (RuntimeError naming the
    missing package otherwise: a list made without one of them would differ silently)."""
    for path, package in ((CMUDICT, "festlex-cmu"), (POSLEX, "festlex-poslex")):
        if not path.exists():
            raise RuntimeError(f"{path} not found; install it with `apt-get install {package}`")
    if shutil.which("espeak-ng") is None:
        raise RuntimeError("espeak-ng not found; install it with `apt-get install espeak-ng`")
    prons = parse_cmudict(CMUDICT.read_text(encoding="latin-1").splitlines())
    freq = parse_poslex(POSLEX.read_text(encoding="latin-1").splitlines())
    near = candidates(prons, freq, per_command=per_command + 5)  # room for espeak's drops
    drop = espeak_homophones(near)
    return {c: [w for w in ws if w not in drop][:per_command] for c, ws in near.items()}


@lru_cache(maxsize=1)
def extra_near_misses() -> dict[str, tuple[str, ...]]:
    """The committed list: command -> its extra near misses, best first."""
    data = json.loads(LIST_PATH.read_text())
    return {c: tuple(data[c]) for c in SC10_LABELS}


def extra_words() -> tuple[str, ...]:
    """Every extra near miss, in the list's order, once."""
    return tuple(dict.fromkeys(w for ws in extra_near_misses().values() for w in ws))


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help=f"rewrite {LIST_PATH.name}")
    p.add_argument("--per-command", type=int, default=PER_COMMAND)
    args = p.parse_args(argv)
    near = from_dictionaries(args.per_command)
    for c, ws in near.items():
        print(f"{c:5s} {len(ws):3d}  {' '.join(ws)}")
    if args.write:
        LIST_PATH.write_text(json.dumps(near, indent=1) + "\n")
        print(f"wrote {LIST_PATH}")


if __name__ == "__main__":
    main()
