"""Sampling and stop-string tests: greedy, seeds, top_k/top_p support, stop matching, tokenizer."""

from __future__ import annotations

import pytest
import torch

from dlr_runtime.engine import ByteTokenizer, SamplingParams, StopMatcher, sample_token


def draws(logits, params, n=200):
    g = params.generator()
    return [sample_token(logits, params, g) for _ in range(n)]


def test_greedy_is_argmax():
    logits = torch.tensor([0.1, 3.0, 2.9, -1.0])
    assert draws(logits, SamplingParams(temperature=0), 5) == [1] * 5


def test_seed_reproducible_and_seeds_differ():
    logits = torch.zeros(50)
    a = draws(logits, SamplingParams(seed=7))
    b = draws(logits, SamplingParams(seed=7))
    c = draws(logits, SamplingParams(seed=8))
    assert a == b
    assert a != c
    assert SamplingParams().seed is not None  # a drawn seed is reported back


def test_top_k_and_top_p_restrict_support():
    logits = torch.tensor([5.0, 4.0, 3.0, 0.0, -1.0, -2.0])
    assert set(draws(logits, SamplingParams(top_k=2, seed=1))) <= {0, 1}
    probs = torch.softmax(logits, 0)
    # smallest prefix with mass >= 0.9: tokens 0 and 1 (0.66 + 0.24 = 0.90...)
    p = float(probs[0] + probs[1]) - 1e-6
    assert set(draws(logits, SamplingParams(top_p=p, seed=2))) == {0, 1}
    assert set(draws(logits, SamplingParams(top_p=0.01, seed=3))) == {0}
    # temperature flattens: with a high temperature every token shows up
    assert set(draws(logits, SamplingParams(temperature=50.0, seed=4), 2000)) == set(range(6))


def test_frequencies_follow_softmax():
    logits = torch.tensor([1.0, 0.0, -1.0])
    got = torch.bincount(torch.tensor(draws(logits, SamplingParams(seed=5), 6000)), minlength=3)
    assert torch.allclose(got / 6000, torch.softmax(logits, 0), atol=0.03)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"temperature": -1}, "temperature"),
        ({"top_k": -2}, "top_k"),
        ({"top_p": 0}, "top_p"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"stop": [""]}, "stop"),
        ({"seed": -5}, "seed"),
    ],
)
def test_invalid_params(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_stop_matcher_holds_back_and_cuts():
    m = StopMatcher(["END", "\n\n"])
    out = []
    for piece in ["he", "llo E", "N", "x", " wor", "ld", "\n", "\n", "more"]:
        text, stopped = m.feed(piece)
        out.append(text)
        if stopped:
            break
    assert "".join(out) == "hello ENx world"
    assert stopped
    m = StopMatcher(["zz"])
    assert m.feed("abz") == ("ab", False)
    assert m.flush() == "z"
    assert StopMatcher([]).feed("abc") == ("abc", False)


def test_byte_tokenizer_roundtrip_and_incremental_utf8():
    tok = ByteTokenizer.from_metadata(
        {"tokenizer": {"type": "bytes", "bos": 256, "eos": 257, "vocab_size": 258}}, 258
    )
    text = "héllo ✓"
    ids = tok.encode(text)
    assert tok.decode(ids + [tok.eos]) == text
    dec = tok.decoder()
    pieces = [dec.feed(i) for i in ids]
    assert "".join(pieces) + dec.flush() == text
    assert "" in pieces  # a multi-byte character waits for its last byte
    with pytest.raises(ValueError, match="vocab_size"):
        ByteTokenizer.from_metadata(
            {"tokenizer": {"type": "bytes", "bos": 1, "eos": 2, "vocab_size": 300}}, 258
        )
    with pytest.raises(ValueError, match="unsupported"):
        ByteTokenizer.from_metadata({"tokenizer": {"type": "bpe"}}, 258)
