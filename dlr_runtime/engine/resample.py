"""Streaming sample-rate conversion: chunked input, output identical to resampling it all at once.

torchaudio's sinc resampler maps each block of `o` input samples (o = orig / gcd) to `n` output
samples (n = new / gcd), reading `width` samples of context on both sides. `StreamResampler`
keeps the unconsumed input plus enough left context, emits only the output blocks whose right
context has arrived, and at `flush()` pads the end with zeros exactly as the one-shot call does.
So chunk boundaries never click, and the result equals `torchaudio.functional.resample` on the
whole stream (up to float rounding).
"""

from __future__ import annotations

import base64
import binascii
import math
from functools import lru_cache

import torch
import torchaudio

MAX_SAMPLE_RATE = 384_000


@lru_cache(maxsize=32)
def _resampler(orig: int, new: int) -> torchaudio.transforms.Resample:
    return torchaudio.transforms.Resample(orig, new)


class StreamResampler:
    """Resample a mono float stream from `orig` Hz to `new` Hz chunk by chunk."""

    def __init__(self, orig: int, new: int) -> None:
        for name, rate in (("input", orig), ("model", new)):
            if not isinstance(rate, int) or not 1 <= rate <= MAX_SAMPLE_RATE:
                raise ValueError(
                    f"{name} sample rate must be in 1..{MAX_SAMPLE_RATE}, got {rate!r}"
                )
        self.orig, self.new = orig, new
        g = math.gcd(orig, new)
        self.o, self.n = orig // g, new // g
        self.identity = orig == new
        if not self.identity:
            self._t = _resampler(orig, new)
            self.width = self._t.width
            self.ctx_blocks = math.ceil(self.width / self.o)  # left context in whole blocks
        self._buf = torch.zeros(0, dtype=torch.float32)  # input from block `_buf_block` on
        self._buf_block = 0  # index of the input block where _buf starts
        self._next_block = 0  # next output block to emit
        self.received = 0  # input samples so far

    def _run(self, x: torch.Tensor) -> torch.Tensor:
        return self._t(x.unsqueeze(0))[0]  # (L,) -> (ceil(L * n / o),)

    def push(self, x: torch.Tensor) -> torch.Tensor:
        """Feed input samples (L,); return the output samples that are final now."""
        x = x.to(torch.float32).reshape(-1)
        self.received += x.numel()
        if self.identity:
            return x
        self._buf = torch.cat([self._buf, x])
        total = self._buf_block * self.o + self._buf.numel()  # input samples received
        last = (total - self.width) // self.o  # blocks < last have their right context
        if last <= self._next_block:
            return x.new_zeros(0)
        out = self._emit(self._buf, last)
        return out

    def _emit(self, buf: torch.Tensor, last: int) -> torch.Tensor:
        """Output blocks [_next_block, last) computed from `buf` (starting at `_buf_block`)."""
        y = self._run(buf)  # output blocks from _buf_block on
        lo = (self._next_block - self._buf_block) * self.n
        hi = (last - self._buf_block) * self.n
        out = y[lo:hi]
        self._next_block = last
        keep_from = max(self._buf_block, last - self.ctx_blocks)  # left context for what follows
        self._buf = self._buf[(keep_from - self._buf_block) * self.o :]
        self._buf_block = keep_from
        return out

    def state_dict(self) -> dict:
        """The stream position and carried input (JSON-serialisable), for snapshots."""
        buf = self._buf.to(torch.float32).contiguous().numpy().tobytes()
        return {
            "orig": self.orig,
            "new": self.new,
            "buf": base64.b64encode(buf).decode(),
            "buf_block": self._buf_block,
            "next_block": self._next_block,
            "received": self.received,
        }

    @classmethod
    def from_state(cls, d: dict) -> StreamResampler:
        """A resampler continuing exactly where `state_dict()` left off (ValueError if bad)."""
        try:
            r = cls(int(d["orig"]), int(d["new"]))
            raw = base64.b64decode(d["buf"], validate=True)
            if len(raw) % 4:
                raise ValueError("carried input is not float32")
            if raw:
                r._buf = torch.frombuffer(bytearray(raw), dtype=torch.float32).clone()
            r._buf_block, r._next_block = int(d["buf_block"]), int(d["next_block"])
            r.received = int(d["received"])
        except (KeyError, TypeError, binascii.Error) as e:
            raise ValueError(f"bad resampler state: {e}") from e
        return r

    def flush(self) -> torch.Tensor:
        """End of stream: the remaining output, with zeros after the last input sample."""
        if self.identity:
            return torch.zeros(0)
        total_out = math.ceil(self.received * self.n / self.o)
        y = self._run(self._buf)
        lo = (self._next_block - self._buf_block) * self.n
        hi = total_out - self._buf_block * self.n
        self._next_block = math.ceil(self.received / self.o) + 1
        self._buf = self._buf[:0]
        return y[lo : max(lo, hi)]
