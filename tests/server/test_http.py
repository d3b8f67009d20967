"""HTTP API through FastAPI's TestClient: health, models, metrics, /v1/generate, limits, errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from server.registry import valid_model_name
from tests.conftest import LM_NAME, SPEECH_NAME
from tests.server.conftest import make_settings
from tests.server.waits import eventually_sync


def sse_events(text: str) -> list:
    out = []
    for block in text.strip().split("\n\n"):
        assert block.startswith("data: "), block
        data = block[len("data: ") :]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_health_ready_models(client):
    assert client.get("/healthz").json() == {"status": "ok", "pid": os.getpid()}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["models"] == [LM_NAME, SPEECH_NAME]
    models = {m["name"]: m for m in client.get("/v1/models").json()["data"]}
    assert models[SPEECH_NAME]["kind"] == "speech"
    assert models[SPEECH_NAME]["labels"][0] == "yes"
    assert models[SPEECH_NAME]["sample_rate"] == 16000
    # the frame alone: the front end's window is the frame (no history in the state)
    assert models[SPEECH_NAME]["frame_window"] == models[SPEECH_NAME]["frame_stride"] == 160
    assert models[SPEECH_NAME]["feature_norm_s"] == 0.0
    assert models[LM_NAME]["kind"] == "lm"
    assert models[LM_NAME]["vocab"] == {"type": "bytes", "size": 258, "bos": 256, "eos": 257}
    # state: ssm (2 layers x 16 x 8 complex64) = 2048 bytes
    assert models[LM_NAME]["state_bytes_per_session"] == 2 * 16 * 8 * 8
    assert models[LM_NAME]["limits"]["max_new_tokens"] == 1024


def test_generate_plain_and_seeded(client):
    body = {"prompt": "hello", "max_new_tokens": 12, "temperature": 0.8, "seed": 42}
    a = client.post("/v1/generate", json=body).json()
    b = client.post("/v1/generate", json=body).json()
    c = client.post("/v1/generate", json={**body, "seed": 43}).json()
    assert a["text"] == b["text"]
    assert a["text"] != c["text"]
    assert a["finish_reason"] == "length"
    assert a["usage"] == {"prompt_tokens": 6, "completion_tokens": 12}  # bos + 5 bytes
    assert a["seed"] == 42


def test_generate_stream_matches_plain(client):
    body = {"prompt": "abc", "max_new_tokens": 8, "temperature": 0}
    plain = client.post("/v1/generate", json=body).json()
    r = client.post("/v1/generate", json={**body, "stream": True})
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    tokens = [e for e in events if e["type"] == "token"]
    done = events[-1]
    assert len(tokens) == 8
    assert [e["index"] for e in tokens] == list(range(8))
    assert done["type"] == "done" and done["finish_reason"] == "length"
    assert done["usage"] == plain["usage"]
    assert "".join(e["text"] for e in tokens) + done["text"] == plain["text"]
    assert done["generated_text"] == plain["text"]


def test_stop_string_cuts_text(client):
    body = {"prompt": "xyz", "max_new_tokens": 30, "temperature": 0}
    full = client.post("/v1/generate", json=body).json()["text"]
    stop = full[5:7]
    cut = client.post("/v1/generate", json={**body, "stop": [stop]}).json()
    assert cut["finish_reason"] == "stop"
    assert cut["text"] == full[: full.index(stop)]
    streamed = sse_events(
        client.post("/v1/generate", json={**body, "stop": stop, "stream": True}).text
    )
    assert "".join(e["text"] for e in streamed) == cut["text"]


def test_max_new_tokens_zero(client):
    r = client.post("/v1/generate", json={"prompt": "hi", "max_new_tokens": 0}).json()
    assert r["text"] == "" and r["finish_reason"] == "length"
    assert r["usage"]["completion_tokens"] == 0


@pytest.mark.parametrize(
    "body,field",
    [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"max_new_tokens": "many"}, "max_new_tokens"),
        ({"max_new_tokens": 100000}, "max_new_tokens"),
        ({"stop": [""]}, "stop"),
        ({"bogus": 1}, "bogus"),
        ({"prompt": 5}, "prompt"),
    ],
)
def test_validation_errors_name_the_field(client, body, field):
    r = client.post("/v1/generate", json={"prompt": "x", **body})
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["param"] == field and field in err["message"]


def test_unknown_and_wrong_kind_model(client):
    r = client.post("/v1/generate", json={"prompt": "x", "model": "nope"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = client.post("/v1/generate", json={"prompt": "x", "model": SPEECH_NAME})
    assert r.status_code == 404 and "not a lm model" in r.json()["error"]["message"]


def test_session_limit_gives_429_with_retry_after(client):
    m = client.app.state.dlr.models[LM_NAME]
    m.sessions = client.app.state.dlr.settings.max_sessions  # every slot taken by others
    try:
        r = client.post("/v1/generate", json={"prompt": "x"})
        assert r.status_code == 429
        assert r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "overloaded"
    finally:
        m.sessions = 0
    assert client.post("/v1/generate", json={"prompt": "x", "max_new_tokens": 1}).status_code == 200


def test_session_limits_are_per_model_with_a_separate_server_wide_cap(models_dir):
    """A full speech model does not block text generation; `max_total_sessions` does."""
    with TestClient(create_app(make_settings(models_dir, max_total_sessions=3))) as c:
        st = c.app.state.dlr
        st.models[SPEECH_NAME].sessions = st.settings.max_sessions
        st.sessions = st.settings.max_sessions  # (the server-wide count includes them)
        try:
            r = c.post("/v1/generate", json={"prompt": "x", "max_new_tokens": 1})
            assert r.status_code == 429  # max_total_sessions=3 is reached
            assert "max_total_sessions" in r.json()["error"]["message"]
            st.sessions = 2
            assert (
                c.post("/v1/generate", json={"prompt": "x", "max_new_tokens": 1}).status_code == 200
            )
        finally:
            st.models[SPEECH_NAME].sessions = 0
            st.sessions = 0
        assert c.get("/v1/models").json()["data"][0]["limits"]["max_total_sessions"] == 3


def test_metrics_exposed(client):
    # greedy, so the count is fixed (an unseeded sample ends early when it draws the end token)
    out = client.post(
        "/v1/generate", json={"prompt": "hello", "max_new_tokens": 3, "temperature": 0}
    )
    assert out.json()["usage"]["completion_tokens"] == 3
    text = client.get("/metrics").text
    for name in (
        "dlr_active_sessions",
        "dlr_queue_depth",
        "dlr_batch_size_bucket",
        "dlr_batch_latency_seconds_bucket",
        "dlr_time_to_first_token_seconds_bucket",
        "dlr_inter_token_latency_seconds_bucket",
        "dlr_generated_tokens_total",
        "dlr_audio_seconds_processed_total",
        "dlr_real_time_factor",
        "dlr_evictions_total",
        "dlr_pool_slots_in_use",
        "dlr_open_websockets",
    ):
        assert name in text, name
    assert f'dlr_generated_tokens_total{{model="{LM_NAME}"}} 3.0' in text
    # the slot is freed by the scheduler just after the response is sent: allow it a moment
    freed = f'dlr_pool_slots_in_use{{model="{LM_NAME}"}} 0.0'
    eventually_sync(lambda: freed in client.get("/metrics").text, timeout=5)


def test_session_log_lines(client, caplog):
    caplog.set_level("INFO", logger="dlr.session")
    # seeded: an unseeded sample of the tiny model may end with its end-of-text token
    body = {"prompt": "hi", "max_new_tokens": 2, "seed": 42}
    reply = client.post("/v1/generate", json=body).json()
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "dlr.session"]
    start, end = lines[-2], lines[-1]
    assert start["event"] == "session_start" and end["event"] == "session_end"
    assert start["session_id"] == end["session_id"] and end["model"] == LM_NAME
    assert end["duration_s"] >= 0 and end["reason"] == reply["finish_reason"] == "length"


def test_empty_or_missing_models_dir(tmp_path: Path):
    for d in (tmp_path / "missing", tmp_path):
        with TestClient(create_app(make_settings(d))) as c:
            assert c.get("/readyz").json()["models"] == []
            r = c.post("/v1/generate", json={"prompt": "x"})
            assert r.status_code == 404


def test_bad_checkpoint_skipped_and_names_checked(tmp_path: Path, models_dir: Path):
    import shutil

    shutil.copytree(models_dir / LM_NAME, tmp_path / LM_NAME)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    shutil.copytree(models_dir / LM_NAME, tmp_path / ".hidden")
    with TestClient(create_app(make_settings(tmp_path))) as c:
        assert c.get("/readyz").json()["models"] == [LM_NAME]
    assert not valid_model_name("../etc") and not valid_model_name("a/b")
    assert valid_model_name("speech-commands") and valid_model_name("byte-lm")
