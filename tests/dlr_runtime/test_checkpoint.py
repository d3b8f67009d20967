"""Checkpoint round trips (both forms) and a clear CheckpointError for every bad checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dlr_runtime import (
    CheckpointError,
    DLRConfig,
    DLRModel,
    load_checkpoint,
    load_recurrent,
    save_checkpoint,
    to_recurrent,
)
from dlr_runtime.checkpoint import CONFIG_FILE, TENSORS_FILE


def lm() -> DLRModel:
    return DLRModel(DLRConfig.preset("micro-lm", vocab_size=30, layer="s4d"), seed=0)


def speech() -> DLRModel:
    cfg = DLRConfig.preset("micro-speech", n_layers=2, frame_stride=8, labels=["yes", "no"])
    return DLRModel(cfg, seed=0)


@pytest.mark.parametrize("make", [lm, speech])
def test_train_round_trip(tmp_path: Path, make) -> None:
    model = make().eval()
    save_checkpoint(model, tmp_path / "ck", summary={"acc": 0.5})
    loaded = load_checkpoint(tmp_path / "ck")
    assert isinstance(loaded, DLRModel)
    assert loaded.config == model.config
    assert loaded.checkpoint_metadata == {"summary": {"acc": 0.5}}
    for (k, v), (k2, v2) in zip(
        model.state_dict().items(), loaded.state_dict().items(), strict=True
    ):
        assert k == k2 and torch.equal(v, v2)


@pytest.mark.parametrize("make", [lm, speech])
def test_recurrent_round_trip_is_exact(tmp_path: Path, make) -> None:
    model = make().double().eval()
    rec = to_recurrent(model, dtype=torch.complex128)
    save_checkpoint(rec, tmp_path / "rec", note="converted")
    back = load_checkpoint(tmp_path / "rec")
    x = (
        torch.randint(0, 30, (2, 50))
        if model.config.encoder == "tokens"
        else torch.randn(2, 64).double()
    )
    y1, s1 = rec.chunk(x, rec.init_state(2))
    y2, s2 = back.chunk(x, back.init_state(2))
    assert back.shared == rec.shared
    torch.testing.assert_close(y1, y2, rtol=0, atol=1e-12)
    # the recurrent checkpoint loads as any dtype, and a train checkpoint converts on load
    save_checkpoint(model, tmp_path / "train")
    r64 = load_recurrent(tmp_path / "train", dtype=torch.complex64)
    assert r64.cdtype == torch.complex64
    y3, _ = r64.chunk(x, r64.init_state(2))
    torch.testing.assert_close(y3.double(), y1, rtol=0, atol=1e-4 * float(y1.abs().max()))


def saved(tmp_path: Path) -> Path:
    return save_checkpoint(lm(), tmp_path / "ck")


def test_missing(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="not found.*nope"):
        load_checkpoint(tmp_path / "nope")
    path = saved(tmp_path)
    (path / TENSORS_FILE).unlink()
    with pytest.raises(CheckpointError, match=f"no {TENSORS_FILE}"):
        load_checkpoint(path)


def test_missing_config(tmp_path: Path) -> None:
    path = saved(tmp_path)
    (path / CONFIG_FILE).unlink()
    with pytest.raises(CheckpointError, match=f"no {CONFIG_FILE}"):
        load_checkpoint(path)


def test_truncated(tmp_path: Path) -> None:
    path = saved(tmp_path)
    data = (path / TENSORS_FILE).read_bytes()
    (path / TENSORS_FILE).write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="model.safetensors is truncated"):
        load_checkpoint(path)


def test_corrupted(tmp_path: Path) -> None:
    path = saved(tmp_path)
    data = bytearray((path / TENSORS_FILE).read_bytes())
    data[-5] ^= 0xFF  # flip bits inside a tensor: size unchanged
    (path / TENSORS_FILE).write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupted"):
        load_checkpoint(path)


def test_garbage_tensor_file_without_checksum(tmp_path: Path) -> None:
    path = saved(tmp_path)
    header = json.loads((path / CONFIG_FILE).read_text())
    del header["tensors"]
    (path / CONFIG_FILE).write_text(json.dumps(header))
    (path / TENSORS_FILE).write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointError, match="could not be parsed as safetensors"):
        load_checkpoint(path)


def test_bad_json(tmp_path: Path) -> None:
    path = saved(tmp_path)
    (path / CONFIG_FILE).write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_checkpoint(path)


def test_wrong_version(tmp_path: Path) -> None:
    path = saved(tmp_path)
    header = json.loads((path / CONFIG_FILE).read_text())
    header["format_version"] = 99
    (path / CONFIG_FILE).write_text(json.dumps(header))
    with pytest.raises(CheckpointError, match="format_version 99"):
        load_checkpoint(path)


def test_shape_mismatch(tmp_path: Path) -> None:
    path = saved(tmp_path)
    header = json.loads((path / CONFIG_FILE).read_text())
    header["config"]["d_model"] = 16  # tensors were saved for d_model = 8
    (path / CONFIG_FILE).write_text(json.dumps(header))
    with pytest.raises(CheckpointError, match="has shape"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="has shape"):
        load_recurrent(path)


def test_recurrent_shape_mismatch(tmp_path: Path) -> None:
    path = save_checkpoint(to_recurrent(lm()), tmp_path / "rec")
    header = json.loads((path / CONFIG_FILE).read_text())
    header["config"]["d_state"] = 5
    (path / CONFIG_FILE).write_text(json.dumps(header))
    with pytest.raises(CheckpointError, match="log_lam.*has shape"):
        load_recurrent(path)


def test_invalid_config(tmp_path: Path) -> None:
    path = saved(tmp_path)
    header = json.loads((path / CONFIG_FILE).read_text())
    header["config"]["layer"] = "mamba"
    (path / CONFIG_FILE).write_text(json.dumps(header))
    with pytest.raises(CheckpointError, match="invalid model config.*layer"):
        load_checkpoint(path)


def test_config_json_round_trip() -> None:
    cfg = speech().config
    assert DLRConfig.from_json(cfg.to_json()) == cfg
    with pytest.raises(ValueError, match="unknown DLRConfig fields"):
        DLRConfig.from_dict({**cfg.to_dict(), "bogus": 1})


def test_decay_floor_round_trips_and_older_configs_load_without_it(tmp_path: Path) -> None:
    cfg = DLRConfig(d_model=8, d_state=4, n_layers=1, vocab_size=16, min_decay=0.002)
    model = DLRModel(cfg, seed=0).eval()
    path = save_checkpoint(model, tmp_path / "floor")
    back = load_checkpoint(path)
    assert back.config.min_decay == 0.002
    x = torch.randint(0, 16, (1, 12))
    with torch.no_grad():
        assert torch.equal(back(x), model(x))
    assert "min_decay" not in DLRConfig(d_model=8).to_dict()  # off: written as before
    with pytest.raises(ValueError, match="min_decay must be in"):
        DLRConfig(min_decay=-0.1)
    with pytest.raises(ValueError, match="min_decay applies to the dlr layer only"):
        DLRConfig(layer="lru", min_decay=0.01)
