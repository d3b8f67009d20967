"""Audio framing shared by every backend: samples in, whole frames out, state kept exactly.

An audio model consumes frames of `frame_stride` samples. The samples of a frame not yet
complete live in the state ("frame_buf", "frame_fill"), so a stream can be cut anywhere,
even inside a frame. A front end whose window reaches back over earlier frames
(`DLRConfig.history` > 0) also keeps the last `history` samples before the frame being filled
("frame_hist", zeros at the start of a stream), and each frame goes to the model as its window:
those samples followed by the frame's own, (W,) = (history + S,). A backend supplies only what
it does with whole frames:

- `audio_step(x_t, state, stride, run_frames)`: one sample per stream; streams that complete a
  frame run its window through `run_frames(windows (b, W), sub_state) -> sub_state`.
- `audio_chunk(x, state, stride, run_frames)`: T samples per stream; complete frames' windows
  (B, F, W) go through `run_frames(windows, state) -> (y (B, F, C), state)`. Streams at
  different offsets inside a frame are processed per offset group.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

State = dict[str, torch.Tensor]
FRAMING_KEYS = ("frame_buf", "frame_fill", "frame_hist")


def push_sample(state: State, x_t: torch.Tensor, stride: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Append one audio sample per stream to its frame buffer, updating `state` in the dict.

    Returns (win (B, W), done (B,)): each stream's window with the new sample (its history,
    then the frame buffer), and which streams completed a frame. A completed frame's buffer is
    zeroed in the state (canonical state, as `take_frames` leaves it) and its window's last
    `history` samples become the new history, so the caller runs `win[done]` through its model.
    """
    rows = torch.arange(x_t.shape[0], device=x_t.device)
    buf = state["frame_buf"].clone()
    buf[rows, state["frame_fill"]] = x_t.to(buf.dtype)
    fill = state["frame_fill"] + 1
    done = fill == stride  # (B,)
    state["frame_buf"] = torch.where(done.unsqueeze(-1), 0.0, buf).to(buf.dtype)
    state["frame_fill"] = torch.where(done, 0, fill)
    if "frame_hist" not in state:
        return buf, done
    hist = state["frame_hist"]
    win = torch.cat([hist, buf], dim=1)  # (B, P + S)
    state["frame_hist"] = torch.where(done.unsqueeze(-1), win[:, -hist.shape[1] :], hist)
    return win, done


def advance_completed(
    state: State,
    frames: torch.Tensor,
    done: torch.Tensor,
    run: Callable[[torch.Tensor, State], State],
) -> State:
    """Run `run(frames, sub_state) -> sub_state` on the rows that completed a frame and write
    every non-framing state tensor of those rows back; other rows are left as they are."""
    if bool(done.all()):
        return run(frames, state)
    if bool(done.any()):
        idx = done.nonzero().squeeze(-1)
        sub = run(frames[idx], {k: v[idx] for k, v in state.items()})
        for k in state:
            if k not in FRAMING_KEYS:
                state[k] = state[k].index_copy(0, idx, sub[k])
    return state


def take_frames(state: State, x: torch.Tensor, fill: int, stride: int) -> torch.Tensor:
    """Join the pending samples (all rows hold `fill`) with x (B, T); return the complete
    frames' windows (B, F, W) and keep the remainder as the new pending samples (and the
    samples before it as the new history) in `state`."""
    samples = torch.cat([state["frame_buf"][:, :fill], x.to(state["frame_buf"].dtype)], dim=1)
    n_frames = samples.shape[1] // stride
    rest = samples[:, n_frames * stride :]  # (B, < stride)
    buf = torch.zeros_like(state["frame_buf"])
    buf[:, : rest.shape[1]] = rest
    state["frame_buf"] = buf
    state["frame_fill"] = torch.full_like(state["frame_fill"], rest.shape[1])
    whole = samples[:, : n_frames * stride]  # (B, F * S)
    if "frame_hist" not in state:
        return whole.reshape(x.shape[0], n_frames, stride)
    hist = state["frame_hist"]
    if n_frames == 0:
        return whole.new_zeros(x.shape[0], 0, hist.shape[1] + stride)
    joined = torch.cat([hist, whole], dim=1)  # (B, P + F * S)
    state["frame_hist"] = joined[:, joined.shape[1] - hist.shape[1] :]
    return joined.unfold(1, hist.shape[1] + stride, stride)  # (B, F, P + S)


def audio_step(
    x_t: torch.Tensor, state: State, stride: int, run_frames: Callable[[torch.Tensor, State], State]
) -> State:
    """One sample per stream (B,); returns the new state (the caller reads its scores)."""
    buf, done = push_sample(state, x_t, stride)
    return advance_completed(state, buf, done, run_frames)


def audio_chunk(
    x: torch.Tensor,
    state: State,
    stride: int,
    run_frames: Callable[[torch.Tensor, State], tuple[torch.Tensor, State]],
) -> tuple[torch.Tensor, State]:
    """T samples per stream (B, T) -> (y (B, F, C) after every completed frame, new state)."""
    fill = state["frame_fill"]
    if bool((fill == fill[0]).all()):
        return run_frames(take_frames(state, x, int(fill[0]), stride), state)
    # streams sit at different offsets inside a frame: process each offset group alone
    outs: list[tuple[torch.Tensor, torch.Tensor]] = []
    for f in torch.unique(fill).tolist():
        idx = (fill == f).nonzero().squeeze(-1)
        sub = {k: v[idx] for k, v in state.items()}
        y, sub = run_frames(take_frames(sub, x[idx], int(f), stride), sub)
        outs.append((idx, y))
        for k in state:
            state[k] = state[k].index_copy(0, idx, sub[k])
    n_frames = {y.shape[1] for _, y in outs}
    if len(n_frames) != 1:
        raise ValueError(
            "streams at different frame offsets complete different numbers of frames in one "
            "chunk; feed them separately or align their chunk lengths"
        )
    y0 = outs[0][1]
    y = torch.empty(x.shape[0], *y0.shape[1:], dtype=y0.dtype, device=y0.device)
    for idx, yy in outs:
        y[idx] = yy
    return y, state
