"""Any chunking of a stream (random boundaries, length-1 chunks, steps mixed in) gives the same
outputs and the same final state as one pass. float64, tolerance 1e-10 (see test_forms.py)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlr_runtime import DLRConfig, DLRModel, to_recurrent

LENGTH = 96
TOKENS = to_recurrent(
    DLRModel(DLRConfig.preset("micro-lm", d_state=6), seed=0).double(),
    dtype=torch.complex128,
    max_block=16,
)
AUDIO = to_recurrent(
    DLRModel(
        DLRConfig.preset(
            "micro-speech", d_state=6, n_layers=2, frame_stride=5, shared_lambda=False
        ),
        seed=0,
    ).double(),
    dtype=torch.complex128,
    max_block=16,
)  # fmt: skip
AUDIO_WINDOW = to_recurrent(
    DLRModel(
        DLRConfig.preset(
            "micro-speech", d_state=6, n_layers=2, frame_stride=5, frame_window=12,
            shared_lambda=False,
        ),
        seed=0,
    ).double(),
    dtype=torch.complex128,
    max_block=16,
)  # fmt: skip  # overlapping windows: each frame's 5 samples after the 7 before them
X_TOKENS = torch.randint(0, 20, (2, LENGTH), generator=torch.Generator().manual_seed(0))
X_AUDIO = torch.randn(2, LENGTH, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


def one_pass(rec, x):
    return rec.chunk(x, rec.init_state(x.shape[0]))


def pieces(draw_cuts: list[int]) -> list[tuple[int, int]]:
    cuts = sorted(set(c for c in draw_cuts if 0 < c < LENGTH))
    bounds = [0, *cuts, LENGTH]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def streamed(rec, x, spans: list[tuple[int, int]], use_step: list[bool]):
    state, outs = rec.init_state(x.shape[0]), []
    for (a, b), as_steps in zip(spans, use_step, strict=True):
        if as_steps:  # feed this piece one input at a time through step()
            for t in range(a, b):
                y, state = rec.step(x[:, t], state)
                # tokens: every step has an output; audio: only a step that completes a frame
                if rec.config.encoder == "tokens" or int(state["frame_fill"][0]) == 0:
                    outs.append(y.unsqueeze(1))
        else:
            y, state = rec.chunk(x[:, a:b], state)
            outs.append(y)
    return torch.cat(outs, dim=1), state


cut_lists = st.lists(st.integers(min_value=1, max_value=LENGTH - 1), max_size=30)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cuts=cut_lists, data=st.data())
def test_any_chunking_tokens(cuts: list[int], data) -> None:
    spans = pieces(cuts)
    use_step = data.draw(st.lists(st.booleans(), min_size=len(spans), max_size=len(spans)))
    y_ref, s_ref = one_pass(TOKENS, X_TOKENS)
    y, s = streamed(TOKENS, X_TOKENS, spans, use_step)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-10 * float(y_ref.abs().max()))
    torch.testing.assert_close(
        s["ssm"], s_ref["ssm"], rtol=0, atol=1e-10 * float(s_ref["ssm"].abs().max())
    )


@pytest.mark.parametrize("rec", [AUDIO, AUDIO_WINDOW], ids=["frame", "window"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cuts=cut_lists, data=st.data())
def test_any_chunking_audio_mid_frame(rec, cuts: list[int], data) -> None:
    """Cuts fall anywhere, also inside a frame: the pending samples (and, with overlapping
    windows, the history before them) live in the state."""
    spans = pieces(cuts)
    use_step = data.draw(st.lists(st.booleans(), min_size=len(spans), max_size=len(spans)))
    y_ref, s_ref = one_pass(rec, X_AUDIO)
    y, s = streamed(rec, X_AUDIO, spans, use_step)
    assert y.shape == y_ref.shape == (2, LENGTH // 5, 2)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-10 * float(y_ref.abs().max()))
    for k in s_ref:
        scale = max(float(s_ref[k].abs().max()), 1.0)
        torch.testing.assert_close(s[k], s_ref[k], rtol=0, atol=1e-10 * scale)


@pytest.mark.parametrize("rec", [AUDIO, AUDIO_WINDOW], ids=["frame", "window"])
def test_rows_at_different_frame_offsets(rec) -> None:
    """A batch whose rows sit at different offsets inside a frame is split into offset groups."""
    x = X_AUDIO
    s0 = rec.init_state(2)
    _, s_a = rec.chunk(x[:1, :3], {k: v[:1] for k, v in s0.items()})  # row 0: 3 samples in
    _, s_b = rec.chunk(x[1:, :5], {k: v[1:] for k, v in s0.items()})  # row 1: frame aligned
    mixed = {k: torch.cat([s_a[k], s_b[k]]) for k in s0}
    y, s = rec.chunk(torch.stack([x[0, 3:8], x[1, 5:10]]), mixed)  # each completes one frame
    y0, _ = rec.chunk(x[:1, 3:8], s_a)
    y1, _ = rec.chunk(x[1:, 5:10], s_b)
    torch.testing.assert_close(y, torch.cat([y0, y1]), rtol=0, atol=1e-12)


def test_steps_of_rows_completing_frames_at_different_times() -> None:
    """Per-sample steps of a batch whose rows complete frames at different samples: each row's
    history advances only with its own frames (the other rows keep theirs)."""
    x = X_AUDIO
    rec = AUDIO_WINDOW
    s_a = rec.chunk(x[:1, :3], rec.init_state(1))[1]
    s_b = rec.chunk(x[1:, :5], rec.init_state(1))[1]
    state = {k: torch.cat([s_a[k], s_b[k]]) for k in s_a}
    for t in range(12):  # row 0 from sample 3, row 1 from sample 5
        _, state = rec.step(torch.stack([x[0, 3 + t], x[1, 5 + t]]), state)
    ref_a = rec.chunk(x[:1, :15], rec.init_state(1))[1]
    ref_b = rec.chunk(x[1:, :17], rec.init_state(1))[1]
    for k in state:
        ref = torch.cat([ref_a[k], ref_b[k]])
        torch.testing.assert_close(state[k], ref, rtol=0, atol=1e-10 * max(1.0, ref.abs().max()))
