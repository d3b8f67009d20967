"""A short soak (benchmarks/soak.py: 20 speech sessions at real-time pace + 4 generation
sessions for ~6 s against a `dlr-serve` subprocess): zero errors, zero lost or duplicated
messages, equal results for equal inputs throughout, bounded RSS growth."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SOAK = Path(__file__).resolve().parents[2] / "benchmarks" / "soak.py"


@pytest.mark.slow  # a dlr-serve subprocess (or two) and tens of seconds of load
def test_short_soak():
    spec = importlib.util.spec_from_file_location("soak", SOAK)
    soak = importlib.util.module_from_spec(spec)
    sys.modules["soak"] = soak  # (dataclasses look their module up)
    spec.loader.exec_module(soak)
    r = soak.main(
        ["--speech", "20", "--gen", "4", "--duration", "6", "--clip-s", "2", "--warmup-s", "3"]
    )
    assert r["errors"] == 0, r["error_samples"]
    assert r["lost_messages"] == 0 and r["duplicated_messages"] == 0
    assert r["mismatched_results"] == 0
    assert r["streams_completed"] >= 20 and r["generations_completed"] >= 4
    assert r["speech_chunk_latency_ms"]["n"] > 100
    assert r["rss_growth_pct"] < 10
