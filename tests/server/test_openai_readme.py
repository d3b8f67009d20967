"""The README's OpenAI-compatible API examples run as written: every ```python block of the
section "OpenAI-compatible API" is executed, in order, against a live server serving the
shipped byte LM (only the address is changed to the test server's)."""

from __future__ import annotations

import contextlib
import io
import re
import shutil
from pathlib import Path

import pytest

from tests.server.conftest import make_settings
from tests.server.live import LiveServer

ROOT = Path(__file__).resolve().parents[2]
BYTE_LM = ROOT / "models" / "byte-lm"
README_URL = "http://127.0.0.1:8000"


def openai_snippets() -> list[str]:
    text = (ROOT / "README.md").read_text()
    start = text.index("\n## OpenAI-compatible API")
    end = text.index("\n## ", start + 1)
    return re.findall(r"```python\n(.*?)```", text[start:end], flags=re.S)


def test_readme_has_an_example_for_each_endpoint():
    code = "\n".join(openai_snippets())
    for call in ("chat.completions.create", "completions.create", "responses.create",
                 "responses.retrieve", "responses.delete", "/v1/prefixes"):  # fmt: skip
        assert call in code, call
    assert README_URL in code


@pytest.mark.slow
@pytest.mark.skipif(not BYTE_LM.exists(), reason="shipped byte LM not present")
def test_readme_openai_examples_run(tmp_path):
    models = tmp_path / "models"
    shutil.copytree(BYTE_LM, models / "byte-lm")  # (a link out of the models dir is refused)
    with LiveServer(make_settings(models, torch_threads=1)) as srv:
        ns: dict = {}
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            for i, snippet in enumerate(openai_snippets()):
                code = compile(snippet.replace(README_URL, srv.http), f"README[{i}]", "exec")
                exec(code, ns)  # noqa: S102 (the README's own examples)
    assert ns["r2"].previous_response_id == ns["r1"].id
    assert len(ns["r"].choices) == 2  # the last `r`: the completions example (n=2)
    assert out.getvalue()  # the streamed chunks and deltas were printed
