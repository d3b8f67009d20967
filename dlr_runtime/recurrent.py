"""The recurrent (inference) form of a DLR network: the network stack around the recurrence.

Per layer it holds only (lam, B, C, D) of the diagonal recurrence, whatever the layer's training
parameterisation was, plus the position-wise parts copied from the trained network. The
recurrence itself (step, chunk tables, block form, plain-loop twins) lives in `diagonal.py`,
the state layout in `state_spec.py`, the audio framing in `framing.py`. Two ways to advance a
batch of streams:

- `step(x_t, state)`: one input per stream, O(H N) per layer.
- `chunk(x, state)`: a block of T inputs per stream in the chunk form (`diagonal.diag_block`);
  long inputs are cut into blocks of `max_block` so memory stays bounded. A backend may pass
  its own `block` (a `BlockFn`: layer i over a block, e.g. the fused kernel of
  `backends.fused_block`) in place of the chunk form; everything around it stays this code.

The state is a dict of batch-first tensors of fixed shape (`state_spec`), so a stream can
be paused, stored, moved and resumed anywhere, including in the middle of an audio frame.
Vandermonde powers are formed in complex128 with wrapped phases (`diagonal.powers`), then cast,
so chunk-mode precision does not depend on the state dtype.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Callable

import torch
from torch import nn

from .config import DLRConfig
from .diagonal import block_consts, c_pairs, diag_block, diag_step
from .feature_norm import normalise_chunk, normalise_step
from .framing import advance_completed, audio_chunk, audio_step, push_sample, take_frames
from .heads import pool_chunk, pool_step
from .model import BlockPointwise, DLRModel, Encoder, Head
from .speech_embedding import SpeechEmbedding
from .speech_embedding_stream import EmbeddingStream
from .ssm import RecurrentParams
from .state_spec import REAL_OF, Spec, State, init_state, state_bytes, state_spec

# layer i over a block: (i, u (B, T, H), x0 (B, H, N), out) -> (y (B, T, H), x_end (B, H, N));
# x_end is written into `out` (B, H, N) when given
BlockFn = Callable[
    [int, torch.Tensor, torch.Tensor, torch.Tensor | None], tuple[torch.Tensor, torch.Tensor]
]

__all__ = [  # framing helpers stay importable from here for older callers
    "BlockFn",
    "RecurrentModel",
    "State",
    "advance_completed",
    "push_sample",
    "take_frames",
    "to_recurrent",
]


class RecurrentModel(nn.Module):
    """Streaming form of a `DLRModel`. Build it with `to_recurrent`. It is also the "torch"
    backend (`backends.base.Backend`): its state is the canonical layout."""

    name = "torch"

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
        fe = self.encoder.frontend if config.encoder == "audio" else None
        # the speech embedding frame by frame from its cached rows, not from 0.78 s windows
        self.embed_stream = EmbeddingStream(fe) if isinstance(fe, SpeechEmbedding) else None
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
        pairs = c_pairs(self.C.to(torch.complex128)).to(self.rdtype)  # (L, H, 2N)
        # C as interleaved (re, -im) pairs: Re(sum_n C x) = <view_as_real(x), pairs>
        self.register_buffer("c_pairs", pairs, persistent=False)
        self._consts: OrderedDict[tuple, dict[str, torch.Tensor]] = OrderedDict()
        self.requires_grad_(False)

    # ------------------------------------------------------------------ state
    @property
    def n_layers(self) -> int:
        return self.lam.shape[0]

    @property
    def device(self) -> torch.device:
        return self.lam.device

    @property
    def spec(self) -> Spec:
        """The per-session state layout (`state_spec.state_spec`)."""
        return state_spec(self.config, self.cdtype)

    def init_state(self, batch: int, device: torch.device | str | None = None) -> State:
        """Zero state for `batch` streams. Every tensor is batch-first and of fixed shape."""
        return init_state(self.spec, batch, self.device if device is None else device)

    def state_bytes(self) -> int:
        """Bytes of one session's state."""
        return state_bytes(self.spec)

    def state_bytes_per_session(self) -> int:  # the name training and server/ use
        return self.state_bytes()

    def to_canonical(self, state: State) -> State:
        """This backend's state is the canonical layout already."""
        return state

    def from_canonical(self, state: State) -> State:
        return {k: v.to(self.device) for k, v in state.items()}

    # ------------------------------------------------------------------ public API
    @torch.no_grad()
    def step(self, x_t: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """One input per stream: token ids (B,) or audio samples (B,).

        Returns (y, new_state): LM logits (B, V), or the current class scores (B, C).
        """
        state = dict(state)
        if self.config.encoder == "tokens":
            return self._core_step(self.encoder.embed(x_t), state)

        def run(frames: torch.Tensor, sub: State) -> State:
            return self._core_step(self._encode(frames, sub), sub)[1]

        state = audio_step(x_t.to(self.rdtype), state, self.config.frame_stride, run)
        return self.scores(state), state

    @torch.no_grad()
    def chunk(
        self, x: torch.Tensor, state: State, block: BlockFn | None = None
    ) -> tuple[torch.Tensor, State]:
        """A block of T inputs per stream: token ids (B, T) or audio samples (B, T).

        Returns (y, new_state) with y (B, T', out_dim): the output after each position
        (T' = T for tokens; for audio, one per frame completed in this chunk). `block`
        replaces the chunk form of each layer (default: `_ssm_chunk`).
        """
        state = dict(state)
        if self.config.encoder == "tokens":
            return self._core_chunk(self.encoder.embed(x), state, block)

        def run(frames: torch.Tensor, sub: State) -> tuple[torch.Tensor, State]:
            return self._core_chunk(self._encode(frames, sub), sub, block)

        return audio_chunk(x.to(self.rdtype), state, self.config.frame_stride, run)

    @torch.no_grad()
    def scores(self, state: State) -> torch.Tensor:
        """Current class scores (B, C) of a classifier from its running mean (0 before any frame)."""
        mean = state["mean_sum"] / state["mean_count"].clamp(min=1).unsqueeze(-1)  # (B, H)
        return self.head.proj(mean.to(self.rdtype))

    # ------------------------------------------------------------------ the stack
    def _encode(self, frames: torch.Tensor, state: State) -> torch.Tensor:
        """Frame windows (B, W) or (B, T, W) -> (B, [T,] H), advancing the feature
        normalisation's state ("feat_sum", "feat_count") and PCEN's ("pcen_sum", "pcen_count") in
        `state` when the model has them."""
        enc = self.encoder
        if self.embed_stream is not None:  # frames (B, [T,] S), no history: the cache has it
            many = frames.dim() == 3
            feats, state["embed_cache"] = self.embed_stream(
                frames if many else frames.unsqueeze(1), state["embed_cache"]
            )
            feats = feats if many else feats.squeeze(1)
        else:
            feats = enc.frontend(frames)  # (B, [T,] F)
        if enc.pcen is not None:
            pcen = enc.pcen.step if feats.dim() == 2 else enc.pcen.chunk
            feats, state["pcen_sum"], state["pcen_count"] = pcen(
                feats, state["pcen_sum"], state["pcen_count"]
            )
        if enc.norm_decay:
            norm = normalise_step if feats.dim() == 2 else normalise_chunk
            feats, state["feat_sum"], state["feat_count"] = norm(
                feats, state["feat_sum"], state["feat_count"], enc.norm_decay
            )
        return enc.frame(feats)

    def _b(self, i: int) -> torch.Tensor | None:
        return None if self.b_is_one[i] else self.B[i]

    def _core_step(self, h: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """One position h (B, H) through all layers and the head."""
        ssm_in = state["ssm"]
        ssm_out = torch.empty_like(ssm_in)  # each layer writes its new state in place
        for i, pw in enumerate(self.blocks):
            u = pw.pre(h)  # (B, H)
            s, _ = diag_step(
                ssm_in[:, i], u, self.lam[i], self.c_pairs[i], self.D[i], self._b(i), ssm_out[:, i]
            )
            h = pw.post(h, s)
        state["ssm"] = ssm_out
        f = self.head.features(h)
        if self.config.decoder == "classifier":
            state["mean_sum"], state["mean_count"] = pool_step(
                state["mean_sum"], state["mean_count"], f.double(), self.head.decay
            )
            return self.scores(state), state
        return self.head.proj(f), state

    def _core_chunk(
        self, h: torch.Tensor, state: State, block: BlockFn | None = None
    ) -> tuple[torch.Tensor, State]:
        """Positions h (B, T, H) through all layers and the head."""
        if h.shape[1] == 0:
            return h.new_zeros(h.shape[0], 0, self.config.out_dim), state
        layer = self._ssm_chunk if block is None else block
        ssm_in = state["ssm"]
        ssm_out = torch.empty_like(ssm_in)  # each layer writes its final state in place
        for i, pw in enumerate(self.blocks):
            u = pw.pre(h)  # (B, T, H)
            s, _ = layer(i, u, ssm_in[:, i], ssm_out[:, i])
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

        Long inputs are cut into blocks of `max_block`. x_end is written into `out` when given
        (it must not alias x0).
        """
        ys = []
        starts = range(0, u.shape[1], self.max_block)
        for k, start in enumerate(starts):
            ub = u[:, start : start + self.max_block]
            last = k == len(starts) - 1
            consts = self._block_consts(i, ub.shape[1])
            y, x0 = diag_block(
                ub, x0, consts, self.C[i], self.D[i], self._b(i), out if last else None
            )
            ys.append(y)
        return (ys[0] if len(ys) == 1 else torch.cat(ys, dim=1)), x0

    def _block_consts(self, i: int, t: int) -> dict[str, torch.Tensor]:
        """`diagonal.block_consts` of layer i and block length t (cached, LRU)."""
        key = (i, t, self.device, self.cdtype)
        hit = self._consts.get(key)
        if hit is not None:
            self._consts.move_to_end(key)
            return hit
        consts = block_consts(self.log_lam[i], self.B[i], self.C[i], t, self.shared[i], self.cdtype)
        self._consts[key] = consts
        if len(self._consts) > 32:
            self._consts.popitem(last=False)
        return consts

    def clear_cache(self) -> None:
        self._consts.clear()

    def _apply(self, fn, recurse=True):  # device/dtype moves invalidate the cached constants
        self._consts = OrderedDict()
        return super()._apply(fn, recurse)


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
