"""`dlr-client` (the installed console script) against a real server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from clients import GenerateClient, SpeechClient

# complex64 state: scores of the same audio differ in float32 rounding with how it is chunked
# and batched (well below what a lost or repeated 10 ms of audio changes)
SCORE_TOL = 1e-5

CLI = Path(sys.executable).parent / "dlr-client"


def cli(
    url: str, *args: str, stdin: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess:
    assert CLI.is_file(), "dlr-client is not installed (pip install -e .)"
    env = {**os.environ, "DLR_URL": url}
    return subprocess.run(
        [str(CLI), *args], input=stdin, capture_output=True, text=True, env=env, timeout=timeout
    )


def test_models(live_server):
    out = cli(live_server.url, "models")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any(line.startswith("tiny-lm") and "lm" in line for line in lines)
    assert any(
        line.startswith("tiny-speech") and "16000 Hz" in line and "yes, no" in line
        for line in lines
    )
    js = json.loads(cli(live_server.url, "models", "--json").stdout)
    assert {m["name"] for m in js} == {"tiny-lm", "tiny-speech"}


def test_speech_files_json_and_text(live_server, word_wav, tmp_path):
    flac = tmp_path / "yes.flac"
    import soundfile as sf

    x, rate = sf.read(word_wav, dtype="int16")
    sf.write(flac, x, rate)
    with SpeechClient(live_server.url) as c:
        ref = c.recognize_file(word_wav)
    # real-time pacing: partials are throttled in time, so a burst may get only the final
    args = ("speech", "--json", "--realtime", "--chunk-ms", "50", str(word_wav), str(flac))
    out = cli(live_server.url, *args)
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    finals = [r for r in rows if r["type"] == "final"]
    assert [r["file"] for r in finals] == [str(word_wav), str(flac)]
    assert all(
        r["label"] == ref.label and r["score"] == pytest.approx(ref.score, abs=SCORE_TOL)
        for r in finals
    )
    assert any(r["type"] == "partial" for r in rows)

    out = cli(live_server.url, "speech", str(word_wav))  # not a terminal: one line per result
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == f"{word_wav}: {ref.label} {ref.score:.3f}"


def test_generate_streams_and_matches_the_library(live_server):
    with GenerateClient(live_server.url) as c:
        ref = c.generate("Once", max_new_tokens=10, temperature=0)
    out = cli(live_server.url, "generate", "Once", "--max-new-tokens", "10", "--temperature", "0")
    assert out.returncode == 0, out.stderr
    assert out.stdout == ref.text + "\n"
    assert "finish: length, 10 tokens" in out.stderr
    events = [
        json.loads(line)
        for line in cli(
            live_server.url,
            "generate",
            "Once",
            "--max-new-tokens",
            "10",
            "--temperature",
            "0",
            "--json",
        ).stdout.splitlines()
    ]
    assert len(events) >= 2 and events[-1]["finish_reason"] == "length"
    whole = json.loads(
        cli(
            live_server.url,
            "generate",
            "Once",
            "--max-new-tokens",
            "10",
            "--temperature",
            "0",
            "--no-stream",
            "--json",
        ).stdout
    )
    assert whole["text"] == ref.text and whole["usage"]["completion_tokens"] == 10


def test_chat_reads_turns_from_stdin(live_server):
    out = cli(
        live_server.url, "chat", "--max-new-tokens", "6", "--temperature", "0", stdin="Hi\nAgain\n"
    )
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.split("\n")) >= 3  # two replies, each ended by a newline


def test_errors_exit_nonzero_with_the_server_code(live_server, word_wav, tmp_path):
    out = cli(live_server.url, "speech", "--model", "nope", str(word_wav))
    assert out.returncode == 1 and "[unknown_model]" in out.stderr
    out = cli(live_server.url, "generate", "x", "--max-new-tokens", "1000000")
    assert out.returncode == 1 and "max_new_tokens" in out.stderr
    out = cli(live_server.url, "speech", str(tmp_path / "missing.wav"))
    assert out.returncode == 2 and "no such file" in out.stderr
    out = cli("http://127.0.0.1:9", "--connect-timeout", "1", "models")
    assert out.returncode == 1 and "cannot connect" in out.stderr


def test_mic_without_sounddevice_says_what_to_install(live_server):
    import importlib.util

    if importlib.util.find_spec("sounddevice") is not None:
        pytest.skip("sounddevice is installed here; this checks the message shown without it")
    out = cli(live_server.url, "speech", "--mic", "--seconds", "1")
    assert out.returncode == 1 and "sounddevice" in out.stderr and "[mic]" in out.stderr
