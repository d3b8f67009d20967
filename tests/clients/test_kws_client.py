"""Continuous mode in the client library and `dlr-client speech --continuous` (live server,
the tiny SC12-style model of tests/kws_audio.py): typed `Detection` events equal the server's
detection messages; the command prints one line per detection with its time, or JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import soundfile as sf

from clients import Detection, SpeechClient, SpeechResult
from tests.kws_audio import NAME, RATE, words, write_kws_model

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def kws_server(tmp_path_factory, server_factory):
    root = tmp_path_factory.mktemp("kws-client-models")
    write_kws_model(root)
    return server_factory(root)


@pytest.fixture(scope="module")
def words_wav(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("kws-wav") / "words.wav"
    sf.write(path, words(), RATE, subtype="PCM_16")
    return path


def run_cli(url: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DLR_URL": url, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-c", "import sys; from clients.cli import main; sys.exit(main())"]
    return subprocess.run(
        [*cmd, *args], capture_output=True, text=True, env=env, timeout=60, cwd=ROOT
    )


def library_events(url: str, wav: Path, **opts) -> list:
    with SpeechClient(url, model=NAME) as c:
        return list(c.stream_file(wav, continuous=True, **opts))


def test_library_yields_typed_detections_then_the_final(kws_server, words_wav):
    events = library_events(kws_server.url, words_wav)
    dets = [e for e in events if isinstance(e, Detection)]
    final = events[-1]
    assert isinstance(final, SpeechResult) and final.is_final
    assert len(dets) >= 2 and final.detections == dets
    assert [d.index for d in dets] == list(range(1, len(dets) + 1))
    assert all(0 <= d.start_ms <= d.end_ms for d in dets)
    partials = [e for e in events if isinstance(e, SpeechResult) and not e.is_final]
    assert {p.vad for p in partials} <= {"speech", "silence"} and partials
    only = library_events(kws_server.url, words_wav, listen=[dets[0].label])
    assert {e.label for e in only if isinstance(e, Detection)} == {dets[0].label}


@pytest.mark.slow  # (3.5 s: kept out of the quick lane)
def test_configure_mid_stream_round_trip(kws_server, tmp_path):
    short = tmp_path / "first-words.wav"  # the first 3.5 s: a word fires, then configure
    sf.write(short, words()[: int(3.5 * RATE)], RATE, subtype="PCM_16")
    with SpeechClient(kws_server.url, model=NAME) as c:
        events = []
        for e in c.stream_file(short, continuous=True, realtime=True, chunk_ms=100):
            events.append(e)
            if isinstance(e, Detection) and c.configured_ms is None:
                assert c.detection["threshold"] < 1.0  # the model's operating point
                c.configure(threshold=1.0)  # nothing reaches it: no detection from here on
        assert c.detection["threshold"] == 1.0 and c.configured_ms is not None
        dets = [e for e in events if isinstance(e, Detection)]
        assert dets and all(d.end_ms <= c.configured_ms for d in dets)
        assert events[-1].detections == dets
        with pytest.raises(ValueError, match="at least one"):
            c.configure()


def test_cli_prints_one_line_per_detection_and_json(kws_server, words_wav):
    dets = [e for e in library_events(kws_server.url, words_wav) if isinstance(e, Detection)]
    out = run_cli(kws_server.url, "speech", "--model", NAME, "--continuous", str(words_wav))
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stdout.splitlines() if "detection(s)" not in ln]
    assert len(lines) == len(dets)
    for ln, d in zip(lines, dets, strict=True):
        assert d.label in ln and f"{d.end_ms / 1000:.2f}s" in ln
    assert f"{len(dets)} detection(s)" in out.stdout
    js = run_cli(
        kws_server.url, "speech", "--model", NAME, "--continuous", "--json", str(words_wav)
    )
    rows = [json.loads(ln) for ln in js.stdout.splitlines()]
    got = [r for r in rows if r["type"] == "detection"]
    assert [(r["label"], r["end_ms"]) for r in got] == [(d.label, d.end_ms) for d in dets]
    assert rows[-1]["type"] == "final" and len(rows[-1]["detections"]) == len(dets)


def test_cli_bad_keyword_exits_nonzero_with_the_server_message(kws_server, words_wav):
    out = run_cli(
        kws_server.url, "speech", "--model", NAME, "--continuous", "--keywords", "banana=0.5",
        str(words_wav),
    )  # fmt: skip
    assert out.returncode != 0 and "banana" in (out.stderr + out.stdout)
