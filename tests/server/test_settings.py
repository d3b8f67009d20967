"""Settings from DLR_* environment variables and dlr-serve flags."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from server.cli import parse_settings
from server.settings import DEFAULT_MODELS_DIR, Settings


def test_defaults_serve_repo_models_on_all_interfaces(monkeypatch):
    for k in ("DLR_HOST", "DLR_PORT", "DLR_MODELS_DIR"):
        monkeypatch.delenv(k, raising=False)
    s = Settings()
    assert (s.host, s.port) == ("0.0.0.0", 8000)
    assert s.models_dir == DEFAULT_MODELS_DIR
    assert Path(__file__).resolve().parents[2] / "models" == DEFAULT_MODELS_DIR


def test_env_and_flags(monkeypatch, tmp_path):
    monkeypatch.setenv("DLR_PORT", "9123")
    monkeypatch.setenv("DLR_MODELS_DIR", str(tmp_path))
    monkeypatch.setenv("DLR_MAX_BATCH_SIZE", "1")
    s = Settings()
    assert (s.port, s.models_dir, s.max_batch_size) == (9123, tmp_path, 1)
    s = parse_settings(
        ["--port", "9000", "--max-batch-wait-ms", "0.5", "--state-dtype", "complex128"]
    )
    assert (s.port, s.max_batch_wait_ms, s.state_dtype, s.max_batch_size) == (
        9000,
        0.5,
        "complex128",
        1,
    )  # flags override env, env fills the rest
    with pytest.raises(SystemExit):
        parse_settings(["--backend", "tensorrt"])


def test_invalid_env_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("DLR_MAX_SESSIONS", "0")
    with pytest.raises(ValidationError, match="max_sessions"):
        Settings()


def test_every_runtime_backend_can_be_chosen_for_the_server(tmp_path):
    from server.metrics import Metrics
    from server.registry import load_models
    from tests.conftest import write_models

    pytest.importorskip("numba")
    s = parse_settings(["--backend", "fused", "--models-dir", str(write_models(tmp_path))])
    models = load_models(s, Metrics())
    names = {e.kind: e.engine.backend.name for e in models.values()}
    assert names == {"lm": "fused", "speech": "fused"}  # decode step / audio chunk block
    assert parse_settings(["--backend", "torch-fast"]).backend == "torch-fast"
    assert parse_settings([]).backend == "fused"  # the default: fastest measured
    assert parse_settings([]).keep_freed_memory
