"""`training.widen_frontend`: a ``logmel`` speech model widened to the ``logmel_pcen`` front end
computes what it did, offline and streamed (float64 1e-12); the command writes a training
checkpoint with the input's metadata and refuses anything but a ``logmel`` model."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from dlr_runtime import DLRModel, load_checkpoint, read_header, save_checkpoint
from dlr_runtime.recurrent import to_recurrent
from tests.dlr_runtime.test_frontend import audio, streamed
from tests.dlr_runtime.test_pcen import config
from training.widen_frontend import main as widen_main
from training.widen_frontend import widen


def test_widened_logmel_model_computes_what_it_did(tmp_path):
    narrow = DLRModel(config(frontend="logmel"), seed=4).double().eval()
    wide = widen(narrow).eval()
    assert wide.config == replace(narrow.config, frontend="logmel_pcen")
    w = wide.encoder.frame.weight.detach()
    assert torch.equal(w[:, : narrow.config.n_mels], narrow.encoder.frame.weight.detach())
    assert not w[:, narrow.config.n_mels :].any()
    x = audio(2, 40 * 60, seed=6)
    with torch.no_grad():
        want = narrow(x)
        assert float((wide(x) - want).abs().max()) < 1e-12
    rec = to_recurrent(wide, dtype=torch.complex128, max_block=16)
    out = streamed(rec, x, [5, 777, 1500], steps_from=2000)
    assert float((out - want).abs().max()) < 1e-12
    # the command line: a training checkpoint with the input's metadata, refused for others
    save_checkpoint(narrow.float(), tmp_path / "narrow", operating_point={"threshold": 0.8})
    assert widen_main([str(tmp_path / "narrow"), "--out", str(tmp_path / "wide")]) == 0
    loaded = load_checkpoint(tmp_path / "wide")
    assert isinstance(loaded, DLRModel) and loaded.config.frontend == "logmel_pcen"
    meta = read_header(tmp_path / "wide")["metadata"]
    assert meta["operating_point"] == {"threshold": 0.8}
    assert meta["widened_from"] == str(tmp_path / "narrow")
    with pytest.raises(SystemExit) as e:
        widen_main([str(tmp_path / "wide"), "--out", str(tmp_path / "again")])
    assert e.value.code == 2
    with pytest.raises(ValueError, match="'logmel' front end"):
        widen(DLRModel(config(frontend="pcen"), seed=0))
