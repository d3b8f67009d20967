"""The page at `/` in headless Chromium: live microphone classification and streamed text.

Chromium's fake microphone plays a WAV of a spoken command (espeak-ng) in a loop; the page
captures it with getUserMedia + an AudioWorklet at the browser's own sample rate and streams
16-bit PCM over `WS /v1/speech/stream`. With the shipped speech model (models/speech-commands)
the page must show the spoken word ("stop"); with only the tiny random test model it must show the
label the server itself gives the same audio. A screenshot is saved under tests/artifacts/.

Skipped only when Chromium or Playwright is not installed (scripts/setup.sh installs both).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from clients import GenerateClient, SpeechClient

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "tests" / "artifacts"
SHIPPED = REPO / "models" / "speech-commands"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = [
    pytest.mark.skipif(
        CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium)"
    ),
    pytest.mark.slow,
]
playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")


@pytest.fixture(scope="module")
def page_server(live_server, server_factory, models_dir, tmp_path_factory):
    """The shipped speech model when it exists (the label must then be the spoken word), else
    the tiny one; the shipped byte LM when it exists, else the tiny one."""
    if not (SHIPPED / "config.json").is_file():
        return live_server, "tiny-speech"
    root = tmp_path_factory.mktemp("page-models")
    shutil.copytree(SHIPPED, root / SHIPPED.name)
    lm = REPO / "models" / "byte-lm"
    lm = lm if (lm / "config.json").is_file() else models_dir / "tiny-lm"
    shutil.copytree(lm, root / lm.name)
    return server_factory(root), SHIPPED.name


WORD = "stop"  # not the first label, so a page stuck on labels[0] cannot pass


@pytest.fixture(scope="module")
def looped_wav(tmp_path_factory) -> Path:
    """The spoken word (espeak-ng, 16 kHz, centred in 1 s) three times: what the fake
    microphone plays over and over."""
    from training.data.speech_synth import synthesize_clip

    x = synthesize_clip(WORD, "en-us", 160, 50)  # (16000,) float32
    path = tmp_path_factory.mktemp("fake-mic") / f"{WORD}-looped.wav"
    sf.write(path, np.tile(x, 3), 16000, subtype="PCM_16")
    return path


@pytest.fixture(scope="module")
def browser(looped_wav: Path, tmp_path_factory):
    args = [
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--autoplay-policy=no-user-gesture-required",
        "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={looped_wav}",
    ]
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=args)
        yield b
        b.close()


def server_label(url: str, model: str, wav: Path) -> tuple[str, list[str]]:
    """The label the server gives the clip over the WebSocket protocol, and all labels."""
    with SpeechClient(url, model=model) as c:  # its own loop thread (Playwright owns this one)
        label = c.recognize_file(wav).label
        return label, c.labels


def test_page_classifies_microphone_and_streams_text(browser, page_server, looped_wav):
    server, model = page_server
    expected, labels = server_label(server.url, model, looped_wav)
    if model == "speech-commands":
        assert expected == WORD, "the shipped model misclassifies the test word"
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    console: list[str] = []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    page.goto(server.url + "/")
    page.wait_for_function("document.querySelectorAll('#speech-model option').length > 0")
    page.select_option("#speech-model", model)
    page.select_option("#speech-mode", "utterance")  # one label per stream (test_browser_kws.py)

    # --- microphone -> live partials -> stop -> final
    page.evaluate(
        "window.__labels = []; new MutationObserver(() => window.__labels.push("
        "document.getElementById('label').textContent)).observe(document.getElementById('label'),"
        " {childList: true, characterData: true, subtree: true})"
    )
    page.click("#mic-start")
    page.wait_for_function(
        "/Listening at \\d+ Hz/.test(document.getElementById('speech-status').textContent)"
        " || /at [0-9.]+ s of audio/.test(document.getElementById('speech-status').textContent)",
        timeout=20000,
    )
    # about three seconds of microphone audio (three loops of the word)
    page.wait_for_function(
        "(() => { const m = document.getElementById('speech-status').textContent"
        ".match(/partial at ([0-9.]+) s/); return m && parseFloat(m[1]) >= 3.0; })()",
        timeout=30000,
    )
    live_label = page.text_content("#label")
    assert live_label in labels
    rate = int(page.evaluate("mic.ctx.sampleRate"))
    page.click("#mic-stop")
    page.wait_for_function(
        "document.getElementById('final-label').textContent !== '–'", timeout=20000
    )
    final = page.text_content("#final-label").split(" ")[0]
    assert page.text_content("#label") == final
    bars = page.eval_on_selector_all(
        "#bars .bar",
        "rows => rows.map(r => [r.dataset.label, r.querySelector('.fill').getBoundingClientRect().width])",
    )
    assert len(bars) == len(labels) and max(w for _, w in bars) > 10  # drawn, in pixels
    assert max(bars, key=lambda b: b[1])[0] == final

    # --- generation streamed token by token into the text box
    page.fill("#prompt", "To be, or not to be")
    page.fill("#max-tokens", "24")
    page.fill("#temperature", "0")
    page.evaluate(
        "window.__updates = 0; new MutationObserver(() => window.__updates++)"
        ".observe(document.getElementById('output'), {childList: true, characterData: true, subtree: true})"
    )
    page.click("#gen-start")
    page.wait_for_function(
        "/finished/.test(document.getElementById('gen-status').textContent)", timeout=30000
    )
    shown = page.text_content("#output")
    updates = page.evaluate("window.__updates")

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "browser-page.png"), full_page=True)
    errors = page.text_content("#errors")
    page_labels = page.evaluate("window.__labels")
    page.close()

    shown_labels = page_labels
    if model == "speech-commands":
        # the shipped model's head is a 0.3 s window: what it says at the stop depends on where
        # in the looped word the microphone stopped, so the page must have shown the word
        # while it was heard, and its final must be a label of the model
        assert WORD in shown_labels, f"the page never showed {WORD!r}: {shown_labels[-20:]}"
        assert final in labels
    else:  # the tiny model's running mean over the whole stream: the server's own label
        assert final == expected, (
            f"page said {final!r}, server says {expected!r} (sample rate {rate})"
        )
    assert rate > 0
    with GenerateClient(server.url) as c:
        ref = c.generate("To be, or not to be", max_new_tokens=24, temperature=0)
    assert shown == ref.text
    assert updates >= 2, "the text arrived in one piece, not token by token"
    assert not errors.strip(), errors
    assert not [c for c in console if c.startswith("error")], console


def test_page_shows_server_errors(browser, live_server):
    page = browser.new_page()
    page.goto(live_server.url + "/")
    page.wait_for_function("document.querySelectorAll('#lm-model option').length > 0")
    page.fill("#prompt", "x")
    page.fill("#max-tokens", "100000")  # over the server's cap: refused with 422 naming the field
    page.click("#gen-start")
    page.wait_for_function("document.querySelectorAll('#errors li').length > 0", timeout=15000)
    text = page.text_content("#errors")
    page.close()
    assert "max_new_tokens" in text


def test_page_with_api_keys(browser, server_factory, models_dir):
    server = server_factory(models_dir, api_keys="page-key-1")
    page = browser.new_page()
    page.goto(server.url + "/")  # the page itself is public
    page.wait_for_function("document.querySelectorAll('#errors li').length > 0", timeout=15000)
    assert "unauthorized" in page.text_content("#errors").lower()
    page.fill("#api-key", "page-key-1")
    page.dispatch_event("#api-key", "change")
    page.wait_for_function("document.querySelectorAll('#speech-model option').length > 0")
    page.click("#mic-start")  # WebSocket with the key as subprotocol
    page.wait_for_function(  # ready, or already a partial (continuous mode sends them at once)
        "/Listening at \\d+ Hz/.test(document.getElementById('speech-status').textContent)"
        " || /at [0-9.]+ s of audio/.test(document.getElementById('speech-status').textContent)",
        timeout=20000,
    )
    page.click("#mic-stop")
    page.wait_for_function(
        "document.getElementById('final-label').textContent !== '–'", timeout=20000
    )
    page.fill("#max-tokens", "5")
    page.click("#gen-start")
    page.wait_for_function(
        "/finished/.test(document.getElementById('gen-status').textContent)", timeout=30000
    )
    assert len(page.text_content("#output")) > 0
    page.close()


def test_threshold_slider_applies_to_the_running_stream(browser, page_server, kws_server_url):
    """Continuous mode: moving the slider while listening sends `configure`; the page shows
    the threshold the server now uses and the audio time it applies from."""
    page = browser.new_page()
    console: list[str] = []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    page.goto(kws_server_url + "/")
    page.wait_for_function("document.querySelectorAll('#speech-model option').length > 0")
    assert page.input_value("#speech-mode") == "continuous"
    page.click("#mic-start")
    page.wait_for_function(
        "/at [0-9.]+ s of audio/.test(document.getElementById('speech-status').textContent)",
        timeout=20000,
    )
    page.fill("#threshold", "0.93")
    page.dispatch_event("#threshold", "input")
    page.wait_for_function(
        "/0\\.93 \\(from [0-9.]+ s\\)/.test(document.getElementById('threshold-value').textContent)",
        timeout=10000,
    )
    page.click("#mic-stop")
    page.wait_for_function(
        "document.getElementById('final-label').textContent !== '–'", timeout=20000
    )
    errors = page.text_content("#errors")
    page.close()
    assert not errors.strip(), errors
    assert not [c for c in console if c.startswith("error")], console


@pytest.fixture(scope="module")
def kws_server_url(server_factory, tmp_path_factory) -> str:
    """A server with the tiny SC12-style test model only (continuous mode by default)."""
    from tests.kws_audio import write_kws_model

    root = tmp_path_factory.mktemp("slider-models")
    write_kws_model(root)
    return server_factory(root).url
