"""The page at `/` in headless Chromium, continuous mode (the default for the microphone).

Chromium's fake microphone plays a WAV of espeak-ng words with pauses; the page must list
exactly the spoken commands, in order, with their times, show the voice-activity state and
send the threshold slider's value; with non-command words in between, only the commands may
be listed. It runs against the shipped SC12 model (models/speech-commands). A screenshot goes
to tests/artifacts/kws-page.png (ignored by git); with DLR_UPDATE_DOCS=1 it replaces the README's
docs/kws-page.png instead, so a test run never changes the repository unasked.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from dlr_runtime import read_header
from tests.kws_audio import COMMANDS, MIXED, RATE, spoken_stream

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "models" / "speech-commands"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
HAS_SHIPPED = (SHIPPED / "config.json").is_file()
SC12 = HAS_SHIPPED and "_unknown_" in read_header(SHIPPED)["config"].labels

# The slider is set to 0.4, a setting on the shipped model's curve (MODEL.md). At its default
# operating point (0.86 over 300 ms) the model finds every one of these commands in the server
# test (tests/server/test_kws_shipped.py), but the en-us "stop" peaked anywhere from 0.86 to 0.92
# over 400 ms depending on where it falls inside a 20 ms frame (benchmarks/bench_kws_phase.py),
# too close to the default for a microphone whose timing is not fixed; the other words stay
# under 0.11, so 0.4 holds whatever the timing.
USER_THRESHOLD = 0.4

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed"),
    pytest.mark.skipif(not HAS_SHIPPED, reason="no model in models/speech-commands"),
    pytest.mark.slow,
]
playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")


@pytest.fixture(scope="module")
def shipped_server(server_factory, tmp_path_factory):
    root = tmp_path_factory.mktemp("kws-page-models")
    shutil.copytree(SHIPPED, root / SHIPPED.name)
    return server_factory(root)


def fake_mic(tmp: Path, words: list[str], lead_s: float = 0.5) -> tuple[Path, float]:
    """The words with pauses, 2 s of quiet after them (the loop restarts after that)."""
    x, _ = spoken_stream(words, pause_s=1.0, lead_s=lead_s)
    x = np.concatenate([x, np.zeros(2 * RATE, np.float32)])
    path = tmp / "words.wav"
    sf.write(path, x, RATE, subtype="PCM_16")
    return path, x.size / RATE


class HeldRelay:
    """Relays the speech socket through Playwright, holding the server's messages (its
    `ready` first) until `release`."""

    def __init__(self) -> None:
        self.route = None
        self.held: list[str | bytes] = []
        self.released = False

    def attach(self, route) -> None:
        self.route = route
        route.connect_to_server().on_message(self._from_server)

    def _from_server(self, message: str | bytes) -> None:
        if self.released:
            self.route.send(message)
        else:
            self.held.append(message)

    def release(self) -> None:
        assert self.route is not None, "the page never opened the speech socket"
        self.released = True
        for message in self.held:
            self.route.send(message)


def run_page(
    wav: Path,
    seconds: float,
    url: str,
    threshold: float | None,
    shot: Path | None,
    hold_ready_ms: int = 0,
):
    """Play `wav` into the page's microphone and read what it lists. With `hold_ready_ms`,
    the server's messages reach the page that much later (as on a slow connection)."""
    args = [
        "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run",
        "--autoplay-policy=no-user-gesture-required", "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream", f"--use-file-for-fake-audio-capture={wav}",
    ]  # fmt: skip
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=args)
        page = b.new_page(viewport={"width": 1280, "height": 900})
        console: list[str] = []
        page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
        relay = HeldRelay()
        if hold_ready_ms:
            page.route_web_socket("**/v1/speech/stream", relay.attach)
        page.goto(url + "/")
        page.wait_for_function("document.querySelectorAll('#speech-model option').length > 0")
        assert page.input_value("#speech-mode") == "continuous"  # the default
        if threshold is not None:
            page.fill("#threshold", str(threshold))
            page.dispatch_event("#threshold", "input")
        page.click("#mic-start")
        if hold_ready_ms:
            page.wait_for_timeout(hold_ready_ms)
            relay.release()
        page.wait_for_function(
            "document.getElementById('vad-state').dataset.state !== 'off'", timeout=20000
        )
        states = set()
        # one pass of the file: until the page has seen `seconds - 1` s of audio
        for _ in range(600):
            states.add(page.get_attribute("#vad-state", "data-state"))
            status = page.text_content("#speech-status")
            heard = " at " in status and "s of audio" in status
            if heard and float(status.split(" at ")[1].split(" s")[0]) >= seconds - 1.0:
                break
            page.wait_for_timeout(100)
        if shot is not None:  # while listening: detections, state, bars
            page.screenshot(path=str(shot), full_page=True)
        page.click("#mic-stop")
        page.wait_for_function(
            "document.getElementById('final-label').textContent !== '–'", timeout=20000
        )
        rows = page.eval_on_selector_all(
            "#detections li", "rows => rows.map(r => [r.dataset.label, Number(r.dataset.endMs)])"
        )
        marks = page.eval_on_selector_all("#timeline .mark", "ms => ms.length")
        errors = page.text_content("#errors")
        b.close()
    return rows, states, marks, errors, console


def screenshot_path() -> Path:
    """Where the listening page's screenshot goes (the module docstring says why)."""
    if os.environ.get("DLR_UPDATE_DOCS") == "1":
        return REPO / "docs" / "kws-page.png"
    (REPO / "tests" / "artifacts").mkdir(exist_ok=True)
    return REPO / "tests" / "artifacts" / "kws-page.png"


def test_page_lists_the_spoken_commands_in_order(shipped_server, tmp_path):
    wav, seconds = fake_mic(tmp_path, COMMANDS)
    threshold = USER_THRESHOLD if SC12 else 0.9
    shot = screenshot_path()
    rows, states, marks, errors, console = run_page(
        wav, seconds, shipped_server.url, threshold, shot
    )
    assert [label for label, _ in rows] == COMMANDS, rows
    assert all(b > a for (_, a), (_, b) in zip(rows, rows[1:], strict=False))  # times in order
    assert marks == len(rows)
    assert {"speech", "silence"} <= states, states
    assert not errors.strip(), errors
    assert not [c for c in console if c.startswith("error")], console


def test_page_lists_only_commands_among_other_words(shipped_server, tmp_path):
    wav, seconds = fake_mic(tmp_path, MIXED)
    rows, _, _, _, _ = run_page(wav, seconds, shipped_server.url, USER_THRESHOLD, None)
    assert [label for label, _ in rows] == [w for w in MIXED if w in COMMANDS], rows


def test_words_spoken_while_the_session_starts_are_not_lost(shipped_server, tmp_path):
    """The fake microphone starts playing when the page asks for it, before the WebSocket is
    open and the session ready: the page holds that audio and sends it once it is."""
    wav, seconds = fake_mic(tmp_path, COMMANDS[:2], lead_s=0.05)
    url = shipped_server.url
    rows, _, _, errors, _ = run_page(wav, seconds, url, USER_THRESHOLD, None, hold_ready_ms=1000)
    assert [label for label, _ in rows] == COMMANDS[:2], rows
    assert not errors.strip(), errors
