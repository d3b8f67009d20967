"""How a continuous session's options combine with the model's operating point."""

from __future__ import annotations

from dlr_runtime.kws import KWSConfig
from server.sessions.listening import session_point

MODEL = KWSConfig(threshold=0.9, keywords={"go": 0.97, "off": 0.95}, smooth_ms=100.0)


def test_options_not_given_keep_the_models():
    assert session_point(MODEL, {}, None) == MODEL
    got = session_point(MODEL, {"listen": ["go"], "refractory_ms": 300.0}, None)
    assert got.keywords == MODEL.keywords and got.threshold == 0.9
    assert got.listen == ["go"] and got.refractory_ms == 300.0


def test_a_session_threshold_replaces_the_models_per_command_thresholds():
    got = session_point(MODEL, {"threshold": 0.6}, None)
    assert got.threshold == 0.6 and got.keywords == {}  # one slider moves every command
    assert got.smooth_ms == 100.0


def test_the_sessions_own_per_command_thresholds_stay():
    got = session_point(MODEL, {"threshold": 0.6, "keywords": {"stop": 0.8}}, None)
    assert got.keywords == {"stop": 0.8}
    # mid-stream: a new threshold keeps what the session set itself, drops the model's
    now = session_point(MODEL, {"keywords": {"stop": 0.8}}, None)
    assert now.keywords == {"stop": 0.8}
    later = session_point(now, {"threshold": 0.7}, {"stop": 0.8})
    assert later.threshold == 0.7 and later.keywords == {"stop": 0.8}
    assert session_point(MODEL, {"threshold": 0.7}, {}).keywords == {}


def test_the_models_point_is_not_changed():
    session_point(MODEL, {"threshold": 0.6}, None)
    assert MODEL.keywords == {"go": 0.97, "off": 0.95} and MODEL.threshold == 0.9
