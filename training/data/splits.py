"""Speaker-disjoint splits of the multi-synthesizer corpus.

A split preset maps each voice to train / valid / test *by speaker*, so a speaker heard in
training (through any engine) is never in valid or test of the same preset:

- ``final``: the shipped model. test = flite ``awb``, festival ``ked_diphone``, the accented
  festival woman ``it-lp`` (Italian ``lp_diphone``), Kokoro's ``jf_tebukuro`` (a woman), the
  Piper voice ``joe`` (so Piper is an engine the final model never hears) and three espeak
  speakers (one m, one f, one klatt variant, every accent); valid = flite ``rms``, the
  accented ``cz-ph``, Kokoro's ``jf_nezumi`` and two espeak speakers (one m, one f); train =
  everything else (the other eight accented festival voices, kal through flite kal/kal16 and
  festival, slt through flite and festival HTS, Kokoro's alpha, gongitsune and kumo and their
  mixes, the remaining espeak variants). In a corpus with the opt-in engines (``engines.py``
  ``MORE_ENGINES``) also: test = MBROLA's ``mb-us1`` (an American woman) and ``mb-hu1`` (a
  Hungarian woman reading English), RHVoice's ``clb`` (an American woman) and ``alan`` (awb),
  Pico's ``en-GB`` (a woman); valid = MBROLA's ``mb-us3`` and RHVoice's ``bdl`` (men). The
  two RHVoice voices whose licence keeps them out of training (``EVAL_ONLY_SPEAKERS``:
  evgeniy-eng, lyubov) are test voices too.
- ``loso-<engine>`` (leave one synthesizer out): test = every voice of ``<engine>``; train =
  every other engine's voices whose speaker is not also a test speaker (so ``loso-flite``
  drops festival's kal and slt, ``loso-festival`` drops flite's kal, kal16 and slt); valid =
  the ``final`` valid voices that are neither test nor sharing a speaker with it. An
  eval-only voice is tested when its engine is held out and dropped otherwise.

The espeak speakers of valid/test are drawn from the seed within each variant family.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from training.data.engines import EVAL_ONLY_SPEAKERS, TTSVoice

PRESETS = (
    "final",
    "loso-espeak",
    "loso-flite",
    "loso-festival",
    "loso-kokoro",
    "loso-piper",
    "loso-mbrola",
    "loso-rhvoice",
    "loso-pico",
)
#: Test and valid speakers of ``final``; those of the opt-in engines (MBROLA's us1 and hu1,
#: RHVoice's clb, Pico's en-GB; RHVoice's alan is awb) only exist in a corpus that renders them.
FINAL_TEST = {
    "awb",
    "ked",
    "it-lp",
    "kokoro-tebukuro",
    "piper-joe",
    "mb-us1",
    "mb-hu1",
    "clb",
    "pico-en-GB",
}
FINAL_VALID = {"rms", "cz-ph", "kokoro-nezumi", "mb-us3", "bdl"}


def _espeak_picks(speakers: Sequence[str], seed: int) -> tuple[set[str], set[str]]:
    """(valid, test) espeak speakers: test one m/f/klatt each, valid one m and one f."""
    rng = np.random.default_rng([seed, 0x5B1])
    fam: dict[str, list[str]] = {"m": [], "f": [], "k": []}
    for s in sorted(set(speakers)):
        v = s.removeprefix("espeak-")
        fam["k" if v.startswith("klatt") else v[0]].append(s)
    valid, test = set(), set()
    for f, n_test, n_valid in (("m", 1, 1), ("f", 1, 1), ("k", 1, 0)):
        group = [fam[f][i] for i in rng.permutation(len(fam[f]))]
        if len(group) < n_test + n_valid + 1:  # too few to split: keep them all in training
            continue
        test.update(group[:n_test])
        valid.update(group[n_test : n_test + n_valid])
    return valid, test


def split_voices(
    voices: Sequence[TTSVoice], preset: str, seed: int = 0
) -> dict[str, list[TTSVoice]]:
    """Assign every voice of ``voices`` to train/valid/test (or drop it) under ``preset``."""
    if preset not in PRESETS:
        raise ValueError(f"unknown split preset {preset!r}; expected one of {PRESETS}")
    e_valid, e_test = _espeak_picks([v.speaker for v in voices if v.engine == "espeak"], seed)
    valid_spk = FINAL_VALID | e_valid
    test_spk = FINAL_TEST | EVAL_ONLY_SPEAKERS | e_test
    out: dict[str, list[TTSVoice]] = {"train": [], "valid": [], "test": []}
    if preset == "final":
        for v in voices:
            name = (
                "test" if v.speaker in test_spk else "valid" if v.speaker in valid_spk else "train"
            )
            out[name].append(v)
        return out
    held = preset.removeprefix("loso-")
    test_speakers = {v.speaker for v in voices if v.engine == held}
    for v in voices:
        if v.engine == held:
            out["test"].append(v)
        elif v.speaker in test_speakers or v.speaker in EVAL_ONLY_SPEAKERS:
            continue  # same person as a test voice through another engine, or eval-only
        elif v.speaker in valid_spk:
            out["valid"].append(v)
        else:
            out["train"].append(v)
    return out


def check_disjoint(split: dict[str, list[TTSVoice]]) -> None:
    """Raise ValueError when a speaker appears in more than one split."""
    seen: dict[str, str] = {}
    for name, voices in split.items():
        for v in voices:
            other = seen.setdefault(v.speaker, name)
            if other != name:
                raise ValueError(f"speaker {v.speaker} is in both {other} and {name}")
