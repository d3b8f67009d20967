"""`training.voice_check`: per-voice figures of a model on chosen corpus voices."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from training.data.corpus import CorpusConfig
from training.data.labels import SC10_LABELS
from training.data.vocab import unknown_words
from training.voice_check import check_voices

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "speech-commands"


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng")
@pytest.mark.skipif(not (SHIPPED / "config.json").exists(), reason="no shipped speech model")
def test_the_shipped_model_knows_two_training_espeak_voices(tmp_path):
    cfg = CorpusConfig(
        engines=("espeak",),
        accents=("en-us",),
        variants=("m1", "f2"),
        espeak_command_renditions=1,
        espeak_unknown_per_voice=4,
        unknown=unknown_words()[:8],
    )
    check = check_voices(str(SHIPPED), cfg, ["espeak"], str(tmp_path))
    assert set(check.per_voice) == {"espeak:en-us+m1", "espeak:en-us+f2"}
    for r in check.per_voice.values():
        # (about 1.0 on espeak-ng training voices; a label mix-up would give ~0.1)
        assert r["command_accuracy"] >= 0.7, r
        assert 0.0 <= r["unknown_accepted"] <= 1.0
    unknown_clips = 2 * cfg.espeak_unknown_per_voice
    accepted = sum(r["unknown_accepted"] for r in check.per_voice.values()) / 2 * unknown_clips
    assert sum(check.accepted.values()) == round(accepted)
    assert all(w in cfg.unknown and c in SC10_LABELS for w, c in check.accepted)
    # every missed command is counted once, under its voice, as something other than itself
    for voice, r in check.per_voice.items():
        n_commands = len(SC10_LABELS) * cfg.espeak_command_renditions
        mine = {k: n for k, n in check.missed.items() if k[0] == voice}
        assert sum(mine.values()) == round((1 - r["command_accuracy"]) * n_commands)
    assert all(c in SC10_LABELS and t != c for _, c, t in check.missed)
