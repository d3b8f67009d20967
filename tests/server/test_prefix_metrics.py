"""The prefix-state cache's metrics on /metrics, against a live server whose cache holds only
a few states: hit tokens equal the cached tokens the responses reported, the hit rate is
hits / lookups, the bytes stay within the bound, and evictions happen and are counted."""

from __future__ import annotations

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import LM_NAME
from tests.server.conftest import make_settings
from tests.server.live import LiveServer


def prefix_metrics(srv: LiveServer) -> dict[str, float]:
    text = httpx.get(srv.http + "/metrics", timeout=10).text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith("dlr_prefix_cache_") and s.labels.get("model") == LM_NAME:
                out[s.name.removeprefix("dlr_")] = s.value
    return out


def test_prefix_cache_metrics_count_hits_bytes_and_evictions(models_dir):
    # ~20 KB: a handful of tiny-lm states (2 KB each, plus logits and keys)
    with LiveServer(make_settings(models_dir, prefix_cache_mb=0.02)) as srv:
        c = openai.OpenAI(base_url=srv.http + "/v1", api_key="x", max_retries=0, timeout=60)
        system = {"role": "system", "content": "A shared system prompt for every request. "}
        cached = 0
        for i in range(12):
            r = c.chat.completions.create(
                model=LM_NAME,
                messages=[system, {"role": "user", "content": f"question {i}: " + "x" * (5 + i)}],
                max_tokens=2,
                temperature=0,
            )
            cached += r.usage.prompt_tokens_details.cached_tokens
        m = prefix_metrics(srv)
    assert cached > 0
    assert m["prefix_cache_hit_tokens_total"] == cached
    assert m["prefix_cache_lookups_total"] >= 12 and m["prefix_cache_hits_total"] >= 1
    rate = m["prefix_cache_hits_total"] / m["prefix_cache_lookups_total"]
    assert abs(m["prefix_cache_hit_rate"] - rate) < 1e-9
    assert 0 < m["prefix_cache_bytes"] <= m["prefix_cache_max_bytes"] == int(0.02 * 2**20)
    assert m["prefix_cache_evictions_total"] > 0  # 12 prompts x 2+ states do not fit
    assert m["prefix_cache_inserts_total"] > m["prefix_cache_entries"] > 0
