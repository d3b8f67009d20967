"""The recurrent (inference) form of a DLR network: fixed-size state, step and chunk.

Per layer it holds only (lam, B, C, D) of the diagonal recurrence (see `ssm.py`), whatever the
layer's training parameterisation was, plus the position-wise parts copied from the trained
network. Two ways to advance a batch of streams:

- `step(x_t, state)`: one input per stream, O(H N) per layer.
- `chunk(x, state)`: a block of T inputs per stream with the chunk form

      y_t   = (u * K)[t] + Re(sum_n C lam^(t+1) x0) + D u_t
      x_end = lam^T x0 + B sum_s lam^(T-1-s) u_s

  i.e. one causal convolution (Toeplitz matmul for short blocks, FFT for long ones) and two
  Vandermonde matmuls; long inputs are cut into blocks of `max_block` so memory stays bounded.

The state is a dict of batch-first tensors of fixed shape (see `init_state`), so a stream can
be paused, stored, moved and resumed anywhere, including in the middle of an audio frame.
Vandermonde powers are formed in complex128 with wrapped phases (`ssm.powers`), then cast,
so chunk-mode precision does not depend on the state dtype.
"""

from __future__ import annotations

import copy
from collections import OrderedDict

import torch
from torch import nn

from .config import DLRConfig
from .heads import pool_chunk, pool_step
from .model import BlockPointwise, DLRModel, Encoder, Head
from .ssm import RecurrentParams, powers

State = dict[str, torch.Tensor]

REAL_OF = {torch.complex64: torch.float32, torch.complex128: torch.float64}
TOEPLITZ_MAX = 64  # blocks up to this length convolve by a Toeplitz matmul, longer ones by FFT
FOLD_BYTES = 8 << 20  # fold C into the cached powers while that matrix stays under 8 MiB


class RecurrentModel(nn.Module):
    """Streaming form of a `DLRModel`. Build it with `to_recurrent`."""

    def __init__(
        self,
        config: DLRConfig,
        encoder: Encoder,
        blocks: list[BlockPointwise],
        head: Head,
        params: list[RecurrentParams],
        dtype: torch.dtype = torch.complex64,
        max_block: int = 256,
    ) -> None:
        super().__init__()
        if dtype not in REAL_OF:
            raise ValueError(f"state dtype must be complex64 or complex128, got {dtype}")
        self.config = config
        self.cdtype = dtype
        self.rdtype = REAL_OF[dtype]
        self.max_block = max_block
        self.encoder = copy.deepcopy(encoder).to(self.rdtype).eval()
        self.blocks = nn.ModuleList(copy.deepcopy(b).to(self.rdtype).eval() for b in blocks)
        self.head = copy.deepcopy(head).to(self.rdtype).eval()
        h, n = config.d_model, config.d_state
        log_lam = torch.stack(
            [p.log_lam.detach().to(torch.complex128).expand(h, n) for p in params]
        )
        self.shared = [p.log_lam.dim() == 1 for p in params]
        self.register_buffer("log_lam", log_lam)  # (L, H, N) complex128, kept for powers
        self.register_buffer("lam", torch.exp(log_lam).to(dtype))  # (L, H, N)
        self.register_buffer("B", torch.stack([_hn(p.B, h, n) for p in params]).to(dtype))
        self.register_buffer("C", torch.stack([_hn(p.C, h, n) for p in params]).to(dtype))
        self.register_buffer("D", torch.stack([p.D.detach() for p in params]).to(self.rdtype))
        self.b_is_one = [bool((p.B == 1).all()) for p in params]  # DLR: B = 1, skip the product
        c = self.C.to(torch.complex128)
        pairs = torch.stack([c.real, -c.imag], dim=-1).reshape(c.shape[0], h, 2 * n)
        # C as interleaved (re, -im) pairs: Re(sum_n C x) = <view_as_real(x), pairs>
        self.register_buffer("c_pairs", pairs.to(self.rdtype), persistent=False)  # (L, H, 2N)
        self._consts: OrderedDict[tuple, dict[str, torch.Tensor]] = OrderedDict()
        self.requires_grad_(False)

    # ------------------------------------------------------------------ state
    @property
    def n_layers(self) -> int:
        return self.lam.shape[0]

    @property
    def device(self) -> torch.device:
        return self.lam.device

    def init_state(self, batch: int, device: torch.device | str | None = None) -> State:
        """Zero state for `batch` streams. Every tensor is batch-first and of fixed shape."""
        dev = self.device if device is None else torch.device(device)
        cfg = self.config
        state: State = {
            "ssm": torch.zeros(
                batch, self.n_layers, cfg.d_model, cfg.d_state, dtype=self.cdtype, device=dev
            )
        }
        if cfg.encoder == "audio":
            state["frame_buf"] = torch.zeros(batch, cfg.frame_stride, dtype=self.rdtype, device=dev)
            state["frame_fill"] = torch.zeros(batch, dtype=torch.int64, device=dev)
        if cfg.decoder == "classifier":
            state["mean_sum"] = torch.zeros(batch, cfg.d_model, dtype=torch.float64, device=dev)
            state["mean_count"] = torch.zeros(batch, dtype=torch.float64, device=dev)
        return state

    def state_bytes_per_session(self) -> int:
        return sum(t.element_size() * t[0].numel() for t in self.init_state(1, "cpu").values())

    # ------------------------------------------------------------------ public API
    @torch.no_grad()
    def step(self, x_t: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """One input per stream: token ids (B,) or audio samples (B,).

        Returns (y, new_state): LM logits (B, V), or the current class scores (B, C).
        """
        state = dict(state)
        if self.config.encoder == "tokens":
            h = self.encoder.embed(x_t)  # (B, H)
            out, state = self._core_step(h, state)
            return out, state
        return self._audio_step(x_t.to(self.rdtype), state)

    @torch.no_grad()
    def chunk(self, x: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """A block of T inputs per stream: token ids (B, T) or audio samples (B, T).

        Returns (y, new_state) with y (B, T', out_dim): the output after each position
        (T' = T for tokens; for audio, one per frame completed in this chunk).
        """
        state = dict(state)
        if self.config.encoder == "tokens":
            return self._core_chunk(self.encoder.embed(x), state)
        return self._audio_chunk(x.to(self.rdtype), state)

    @torch.no_grad()
    def scores(self, state: State) -> torch.Tensor:
        """Current class scores (B, C) of a classifier from its running mean (0 before any frame)."""
        mean = state["mean_sum"] / state["mean_count"].clamp(min=1).unsqueeze(-1)  # (B, H)
        return self.head.proj(mean.to(self.rdtype))

    # ------------------------------------------------------------------ audio framing
    def _audio_step(self, x_t: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        buf, done = push_sample(state, x_t, self.config.frame_stride)

        def run(frames: torch.Tensor, sub: State) -> State:
            return self._core_step(self.encoder.encode_frames(frames), sub)[1]

        state = advance_completed(state, buf, done, run)
        return self.scores(state), state

    def _audio_chunk(self, x: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        fill = state["frame_fill"]
        if bool((fill == fill[0]).all()):
            return self._audio_chunk_aligned(x, state, int(fill[0]))
        # streams sit at different offsets inside a frame: process each offset group alone
        outs: list[tuple[torch.Tensor, torch.Tensor]] = []
        for f in torch.unique(fill).tolist():
            idx = (fill == f).nonzero().squeeze(-1)
            sub = {k: v[idx] for k, v in state.items()}
            y, sub = self._audio_chunk_aligned(x[idx], sub, int(f))
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

    def _audio_chunk_aligned(
        self, x: torch.Tensor, state: State, fill: int
    ) -> tuple[torch.Tensor, State]:
        frames = take_frames(state, x, fill, self.config.frame_stride)  # (B, F, stride)
        return self._core_chunk(self.encoder.encode_frames(frames), state)

    # ------------------------------------------------------------------ the stack
    def _core_step(self, h: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """One position h (B, H) through all layers and the head."""
        ssm_in = state["ssm"]
        ssm_out = torch.empty_like(ssm_in)  # each layer writes its new state in place
        bsz, _, hdim, n = ssm_in.shape
        for i, pw in enumerate(self.blocks):
            u = pw.pre(h)  # (B, H)
            bu = u.unsqueeze(-1).to(self.cdtype)  # (B, H, 1)
            if not self.b_is_one[i]:
                bu = self.B[i] * bu  # (B, H, N)
            x = torch.addcmul(bu, self.lam[i], ssm_in[:, i], out=ssm_out[:, i])  # lam x + B u
            xr = torch.view_as_real(x).reshape(bsz, hdim, 2 * n)  # (B, H, 2N), a view
            s = (xr * self.c_pairs[i]).sum(-1) + self.D[i] * u  # Re(sum_n C x) + D u  (B, H)
            h = pw.post(h, s)
        state["ssm"] = ssm_out
        f = self.head.features(h)
        if self.config.decoder == "classifier":
            state["mean_sum"], state["mean_count"] = pool_step(
                state["mean_sum"], state["mean_count"], f.double(), self.head.decay
            )
            return self.scores(state), state
        return self.head.proj(f), state

    def _core_chunk(self, h: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """Positions h (B, T, H) through all layers and the head."""
        if h.shape[1] == 0:
            return h.new_zeros(h.shape[0], 0, self.config.out_dim), state
        ssm_in = state["ssm"]
        ssm_out = torch.empty_like(ssm_in)  # each layer writes its final state in place
        for i, pw in enumerate(self.blocks):
            u = pw.pre(h)  # (B, T, H)
            s, _ = self._ssm_chunk(i, u, ssm_in[:, i], out=ssm_out[:, i])
            h = pw.post(h, s)
        state["ssm"] = ssm_out
        f = self.head.features(h)  # (B, T, H)
        if self.config.decoder == "classifier":
            sums, counts = pool_chunk(  # (B, T, H), (B, T) float64
                f.double(), state["mean_sum"], state["mean_count"], self.head.decay
            )
            state["mean_sum"], state["mean_count"] = sums[:, -1], counts[:, -1]
            return self.head.proj((sums / counts.unsqueeze(-1)).to(self.rdtype)), state
        return self.head.proj(f), state

    def _ssm_chunk(
        self, i: int, u: torch.Tensor, x0: torch.Tensor, out: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer i over a block: u (B, T, H), x0 (B, H, N) -> (y (B, T, H), x_end (B, H, N)).

        x_end is written into `out` when given (it must not alias x0).
        """
        ys = []
        starts = range(0, u.shape[1], self.max_block)
        for k, start in enumerate(starts):
            last = k == len(starts) - 1
            y, x0 = self._ssm_block(
                i, u[:, start : start + self.max_block], x0, out if last else None
            )
            ys.append(y)
        return (ys[0] if len(ys) == 1 else torch.cat(ys, dim=1)), x0

    def _ssm_block(
        self, i: int, u: torch.Tensor, x0: torch.Tensor, out: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        bsz, t, h = u.shape
        n = self.config.d_state
        c = self._block_consts(i, t)
        ut = u.transpose(1, 2)  # (B, H, T)
        if t <= TOEPLITZ_MAX:
            conv = torch.einsum("bhs,hts->bht", ut, c["toeplitz"])  # (B, H, T)
        else:
            conv = torch.fft.irfft(torch.fft.rfft(ut, n=2 * t) * c["kf"], n=2 * t)[..., :t]
        # Re(sum_n C lam^(t+1) x0) as one real contraction over interleaved (re, im) pairs
        x0r = torch.view_as_real(x0).reshape(bsz, h, 2 * n)  # (B, H, 2N), a view
        if "wfree" in c:  # C folded into the powers: (H, 2N, T)
            free = torch.einsum("bhk,hkt->bht", x0r, c["wfree"])
        else:  # large blocks: multiply by C first, keep the powers shared
            z = torch.view_as_real(x0 * self.C[i]).reshape(bsz, h, 2 * n)
            free = torch.einsum("bhk,hkt->bht", z, c["vout"]) if c["vout"].dim() == 3 else (
                (z.reshape(bsz * h, 2 * n) @ c["vout"]).reshape(bsz, h, t)
            )  # fmt: skip
        y = conv + free + self.D[i].unsqueeze(-1) * ut  # (B, H, T)
        if c["vin"].dim() == 2:  # shared lambda: one (T, 2N) matrix for every feature
            acc = (ut.reshape(bsz * h, t) @ c["vin"]).reshape(bsz, h, n, 2)
        else:
            acc = torch.einsum("bht,htk->bhk", ut, c["vin"]).reshape(bsz, h, n, 2)
        acc_c = torch.view_as_complex(acc.contiguous())  # sum_s lam^(T-1-s) u_s  (B, H, N)
        if not self.b_is_one[i]:
            acc_c = self.B[i] * acc_c
        x_end = torch.addcmul(acc_c, c["lam_t"], x0, out=out)  # lam^T x0 + acc, one pass
        return y.transpose(1, 2), x_end

    def _block_consts(self, i: int, t: int) -> dict[str, torch.Tensor]:
        """Input-independent tensors for layer i and block length t (cached, LRU).

        Real matrices hold complex numbers as interleaved (re, im) pairs, matching
        `view_as_real` of the state, so no op splits or joins real and imaginary parts.
        """
        key = (i, t, self.device, self.cdtype)
        hit = self._consts.get(key)
        if hit is not None:
            self._consts.move_to_end(key)
            return hit
        h, n = self.config.d_model, self.config.d_state
        shared = self.shared[i]
        log_lam = self.log_lam[i][:1] if shared else self.log_lam[i]  # (Hs, N)
        v = powers(log_lam, torch.arange(t + 1, device=self.device))  # (Hs, N, T+1) complex128
        vout = v[..., 1:]  # lam^(t+1), t < T
        vin = v[..., :t].flip(-1)  # lam^(T-1-s), s < T
        rd = self.rdtype
        vin_r = torch.view_as_real(vin.transpose(-1, -2).contiguous()).reshape(-1, t, 2 * n)
        c128 = self.C[i].to(torch.complex128)  # (H, N)
        cb = c128 * self.B[i].to(torch.complex128)  # (H, N)
        vk = v[..., :t]
        kern = (cb @ vk[0]).real if shared else (cb.unsqueeze(-1) * vk).sum(-2).real  # (H, T)
        consts = {
            "vin": (vin_r[0] if shared else vin_r).to(rd),  # (T, 2N) or (H, T, 2N)
            "lam_t": v[..., t].expand(h, n).to(self.cdtype),  # lam^T (H, N)
        }
        if h * 2 * n * t * torch.finfo(rd).bits // 8 <= FOLD_BYTES:
            w = c128.unsqueeze(-1) * vout  # (H, N, T)
            consts["wfree"] = torch.stack([w.real, -w.imag], dim=2).reshape(h, 2 * n, t).to(rd)
        else:
            vo = torch.stack([vout.real, -vout.imag], dim=-2).reshape(-1, 2 * n, t).to(rd)
            consts["vout"] = vo[0] if shared else vo  # (2N, T) or (H, 2N, T)
        if t <= TOEPLITZ_MAX:
            idx = torch.arange(t, device=self.device)
            lag = idx.view(-1, 1) - idx.view(1, -1)  # (T, T): t - s
            consts["toeplitz"] = torch.where(lag >= 0, kern[:, lag.clamp(min=0)], 0).to(rd)
        else:
            consts["kf"] = torch.fft.rfft(kern.to(rd), n=2 * t)  # (H, T+1)
        self._consts[key] = consts
        if len(self._consts) > 32:
            self._consts.popitem(last=False)
        return consts

    def clear_cache(self) -> None:
        self._consts.clear()

    def _apply(self, fn, recurse=True):  # device/dtype moves invalidate the cached constants
        self._consts = OrderedDict()
        return super()._apply(fn, recurse)


FRAMING_KEYS = ("frame_buf", "frame_fill")


def push_sample(state: State, x_t: torch.Tensor, stride: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Append one audio sample per stream to its frame buffer, updating `state` in the dict.

    Returns (buf (B, stride), done (B,)): the buffers with the new sample, and which streams
    completed a frame. A completed frame's buffer is zeroed in the state (canonical state, as
    `take_frames` leaves it), so the caller runs `buf[done]` through its model.
    """
    rows = torch.arange(x_t.shape[0], device=x_t.device)
    buf = state["frame_buf"].clone()
    buf[rows, state["frame_fill"]] = x_t
    fill = state["frame_fill"] + 1
    done = fill == stride  # (B,)
    state["frame_buf"] = torch.where(done.unsqueeze(-1), 0.0, buf).to(buf.dtype)
    state["frame_fill"] = torch.where(done, 0, fill)
    return buf, done


def advance_completed(state: State, frames: torch.Tensor, done: torch.Tensor, run) -> State:
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
    frames (B, F, stride) and keep the remainder as the new pending samples in `state`."""
    samples = torch.cat([state["frame_buf"][:, :fill], x], dim=1)  # (B, fill + T)
    n_frames = samples.shape[1] // stride
    rest = samples[:, n_frames * stride :]  # (B, < stride)
    buf = torch.zeros_like(state["frame_buf"])
    buf[:, : rest.shape[1]] = rest
    state["frame_buf"] = buf
    state["frame_fill"] = torch.full_like(state["frame_fill"], rest.shape[1])
    return samples[:, : n_frames * stride].reshape(x.shape[0], n_frames, stride)


def _hn(t: torch.Tensor, h: int, n: int) -> torch.Tensor:
    return t.detach().to(torch.complex128).expand(h, n).clone()


def to_recurrent(
    model: DLRModel, dtype: torch.dtype = torch.complex64, max_block: int = 256
) -> RecurrentModel:
    """Convert a trained network to its recurrent form (state in complex64 or complex128).

    complex128 keeps long streams exact (lambda rounding drifts as ~t * 6e-8 in complex64);
    complex64 is faster and fine for streams of up to ~1e4-1e5 steps.
    """
    with torch.no_grad():
        params = [blk.ssm.recurrent_params() for blk in model.blocks]
    return RecurrentModel(
        model.config,
        model.encoder,
        [blk.pw for blk in model.blocks],
        model.head,
        params,
        dtype=dtype,
        max_block=max_block,
    )
