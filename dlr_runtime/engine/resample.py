"""Streaming sample-rate conversion at any rate a client may send, in bounded memory and time.

Output sample k lies at input time c_k = k * orig / new (in input samples). Like torchaudio's
default sinc resampler (hann-windowed sinc, 6 zero crossings, rolloff 0.99) it is

    y[k] = sum_j x[j] * h((j / orig - k / new) * fc) * fc / orig,    fc = 0.99 * min(orig, new)
    h(t) = sinc(t) * cos(pi t / 12)^2 for |t| < 6, else 0

so for rates torchaudio handles cheaply the output equals `torchaudio.functional.resample` up
to float rounding. Unlike torchaudio, nothing here grows with the rates' gcd: each output reads
a fixed window of `taps = 2 * radius + 2` inputs starting at floor(c_k) - radius, with
radius = ceil(6 * orig / fc) (16 taps when upsampling, 294 at 384 kHz -> 16 kHz). The kernel
values of an output depend only on k mod n (n = new / gcd); when those n rows fit in
`MAX_TABLE_BYTES` they come from a cached phase table (LRU bounded by total bytes), otherwise
they are computed per output (cost `taps` per output sample, no table at all). Work is done in
blocks of at most `_BLOCK_ELEMS` kernel entries, so memory is bounded by the block, not the chunk
or the rates.

Streaming: `push` emits outputs whose whole window has arrived and keeps only the input still
needed; `flush` pads the end with zeros. Each output's arithmetic depends only on absolute
indices, so any chunking of the input gives exactly (bitwise) the one-shot output.
Rates outside `MIN_SAMPLE_RATE..MAX_SAMPLE_RATE` raise `SampleRateError` (a ValueError).
"""

from __future__ import annotations

import base64
import math
import threading
from collections import OrderedDict

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

MIN_SAMPLE_RATE = 1_000
MAX_SAMPLE_RATE = 384_000
ZERO_CROSSINGS = 6  # lowpass_filter_width of torchaudio's default
ROLLOFF = 0.99
MAX_TABLE_BYTES = 1 << 20  # one phase table at most (else kernels are computed per output)
CACHE_BYTES = 8 << 20  # all cached phase tables together
_BLOCK_ELEMS = 1 << 17  # (outputs x taps) per step: bounds the work arrays (~1 MiB each)


class SampleRateError(ValueError):
    """A sample rate outside the supported range (or not an integer)."""


def check_rate(rate: object, what: str = "sample rate") -> int:
    """`rate` as an int in MIN_SAMPLE_RATE..MAX_SAMPLE_RATE, else SampleRateError."""
    if isinstance(rate, bool) or not isinstance(rate, int):
        raise SampleRateError(f"{what} must be an integer, got {rate!r}")
    if not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:
        raise SampleRateError(
            f"{what} must be in {MIN_SAMPLE_RATE}..{MAX_SAMPLE_RATE} Hz, got {rate}"
        )
    return rate


class _Design:
    """The kernel of one rate pair: window geometry, and kernel rows for given outputs."""

    def __init__(self, orig: int, new: int) -> None:
        self.orig, self.new = orig, new
        g = math.gcd(orig, new)
        self.o, self.n = orig // g, new // g  # reduced rates: the pattern repeats every n outputs
        fc = ROLLOFF * min(orig, new)
        self.radius = math.ceil(ZERO_CROSSINGS * orig / fc)
        self.taps = 2 * self.radius + 2
        self._scale = fc / orig
        self._tscale = ROLLOFF * min(self.o, self.n) / (self.o * self.n)  # t = (j n - k o) * this
        self._offsets = torch.arange(self.taps, dtype=torch.int64)  # (taps,)
        self.table: torch.Tensor | None = None
        if self.n * self.taps * 8 <= MAX_TABLE_BYTES:
            self.table = self._rows(torch.arange(self.n, dtype=torch.int64))  # (n, taps)

    def first_input(self, k: torch.Tensor) -> torch.Tensor:
        """Index of the first input each output reads: floor(k * o / n) - radius. (M,)"""
        return torch.div(k * self.o, self.n, rounding_mode="floor") - self.radius

    def first_input_of(self, k: int) -> int:
        """`first_input` of one output index (Python ints, exact)."""
        return k * self.o // self.n - self.radius

    def _rows(self, k: torch.Tensor) -> torch.Tensor:
        """Kernel rows of outputs k (M,) -> (M, taps) float64, computed from their formula."""
        j = self.first_input(k)[:, None] + self._offsets  # (M, taps)
        t = (j * self.n - k[:, None] * self.o).to(torch.float64) * self._tscale  # exact ints
        window = torch.cos(t * (math.pi / (2 * ZERO_CROSSINGS))) ** 2
        kernel = torch.sinc(t) * window * self._scale
        return torch.where(t.abs() < ZERO_CROSSINGS, kernel, torch.zeros_like(t))

    def rows(self, k: torch.Tensor) -> torch.Tensor:
        """Kernel rows of outputs k (M,) -> (M, taps), from the phase table when there is one."""
        if self.table is not None:
            return self.table[k % self.n]
        return self._rows(k)

    @property
    def nbytes(self) -> int:
        return 0 if self.table is None else self.table.numel() * 8


class _DesignCache:
    """LRU of designs bounded by the bytes of their phase tables (thread-safe)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[tuple[int, int], _Design] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(d.nbytes for d in self._items.values())

    def get(self, orig: int, new: int) -> _Design:
        key = (orig, new)
        with self._lock:
            d = self._items.get(key)
            if d is not None:
                self._items.move_to_end(key)
                return d
        d = _Design(orig, new)  # (outside the lock: at most MAX_TABLE_BYTES of work)
        with self._lock:
            self._items[key] = d
            self._items.move_to_end(key)
            total = sum(v.nbytes for v in self._items.values())
            while total > self.max_bytes and len(self._items) > 1:
                _, old = self._items.popitem(last=False)
                total -= old.nbytes
        return d

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


DESIGNS = _DesignCache(CACHE_BYTES)


class StreamResampler:
    """Resample a mono float stream from `orig` Hz to `new` Hz chunk by chunk."""

    def __init__(self, orig: int, new: int) -> None:
        self.orig = check_rate(orig, "input sample rate")
        self.new = check_rate(new, "model sample rate")
        self.identity = orig == new
        self._d = None if self.identity else DESIGNS.get(orig, new)
        self._buf = torch.zeros(0, dtype=torch.float32)  # input samples from index _start on
        self._start = 0  # absolute index of _buf[0]
        self._next = 0  # next output index to emit
        self.received = 0  # input samples so far

    def _compute(self, k0: int, k1: int, tail: int) -> torch.Tensor:
        """Outputs [k0, k1) (k1-k0,): the carried input, zeros before the stream and `tail`
        zeros after it. Each output is sum(window * kernel row) over the same taps in the same
        order whichever way its window is gathered, so chunking never changes a bit."""
        d = self._d
        assert d is not None
        lead = max(0, self._start - d.first_input_of(k0))  # zeros before index 0 of the stream
        padded = torch.cat(  # input from absolute index _start - lead on, float64
            [
                torch.zeros(lead, dtype=torch.float64),
                self._buf.to(torch.float64),
                torch.zeros(tail, dtype=torch.float64),
            ]
        )
        base = self._start - lead  # absolute index of padded[0]
        out = torch.empty(k1 - k0, dtype=torch.float32)
        if d.table is not None and k1 - k0 >= 16 * d.n:  # long runs: one strided view per phase
            per = max(1, _BLOCK_ELEMS // d.taps)  # outputs per phase per step
            for lo in range(k0, k1, per * d.n):
                hi = min(lo + per * d.n, k1)
                for p in range(min(d.n, hi - lo)):
                    count = (hi - 1 - (lo + p)) // d.n + 1
                    x = padded.as_strided(
                        (count, d.taps), (d.o, 1), d.first_input_of(lo + p) - base
                    )  # (count, taps): windows of outputs lo+p, lo+p+n, ...
                    row = d.table[(lo + p) % d.n]  # (taps,)
                    out[lo + p - k0 : hi - k0 : d.n] = (x * row).sum(-1).to(torch.float32)
            return out
        block = max(1, _BLOCK_ELEMS // d.taps)
        for lo in range(k0, k1, block):
            k = torch.arange(lo, min(lo + block, k1), dtype=torch.int64)  # (M,)
            idx = d.first_input(k)[:, None] + d._offsets - base  # (M, taps)
            x = padded[idx]  # (M, taps)
            out[lo - k0 : lo - k0 + k.numel()] = (x * d.rows(k)).sum(-1).to(torch.float32)
        return out

    def _trim(self) -> None:
        """Drop input no later output reads."""
        assert self._d is not None
        keep = max(self._start, self._d.first_input_of(self._next))
        self._buf = self._buf[keep - self._start :]
        self._start = keep

    def push(self, x: torch.Tensor) -> torch.Tensor:
        """Feed input samples (L,); return the output samples that are final now."""
        if self.identity:  # (the hot path of a client at the model's rate: count only)
            self.received += x.numel()
            return x if x.dtype == torch.float32 and x.dim() == 1 else x.float().reshape(-1)
        x = x.to(torch.float32).reshape(-1)
        self.received += x.numel()
        d = self._d
        assert d is not None
        self._buf = torch.cat([self._buf, x])
        # output k is final once its last input, first_input(k) + taps - 1, has arrived:
        # floor(k o / n) <= received - taps + radius  <=>  k <= ((that + 1) n - 1) // o
        last = ((self.received - d.taps + d.radius + 1) * d.n - 1) // d.o
        if last < self._next:
            return x.new_zeros(0)
        out = self._compute(self._next, last + 1, 0)
        self._next = last + 1
        self._trim()
        return out

    def flush(self) -> torch.Tensor:
        """End of stream: the remaining output, with zeros after the last input sample."""
        if self.identity:
            return torch.zeros(0)
        d = self._d
        assert d is not None
        total = -(-self.received * self.new // self.orig)  # ceil(received * new / orig)
        if total <= self._next:
            return torch.zeros(0)
        end = d.first_input_of(total - 1) + d.taps
        out = self._compute(self._next, total, max(0, end - self.received))
        self._next = total
        self._buf = self._buf[:0]
        self._start = self.received
        return out

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """The stream position and carried input (JSON-serialisable), for snapshots."""
        buf = self._buf.to(torch.float32).contiguous().numpy().tobytes()
        return {
            "orig": self.orig,
            "new": self.new,
            "buf": base64.b64encode(buf).decode(),
            "start": self._start,
            "next": self._next,
            "received": self.received,
        }

    @classmethod
    def from_state(cls, d: dict) -> StreamResampler:
        """A resampler continuing exactly where `state_dict()` left off (ValueError if bad)."""
        st = ResamplerState.parse(d)
        r = cls(st.orig, st.new)
        try:
            raw = base64.b64decode(st.buf, validate=True)
        except ValueError as e:  # (binascii.Error)
            raise ValueError(f"bad resampler state: buf is not base64: {e}") from e
        if len(raw) % 4:
            raise ValueError("bad resampler state: carried input is not float32")
        if raw:
            r._buf = torch.frombuffer(bytearray(raw), dtype=torch.float32).clone()
            if not torch.isfinite(r._buf).all():
                raise ValueError("bad resampler state: carried input must be finite")
        r._start, r._next, r.received = st.start, st.next, st.received
        if r.identity:
            if raw:
                raise ValueError("bad resampler state: an identity resampler carries no input")
            return r
        assert r._d is not None
        if r._start + r._buf.numel() != r.received:
            raise ValueError("bad resampler state: carried input does not end at received")
        if r._start > max(0, r._d.first_input_of(r._next)):
            raise ValueError("bad resampler state: carried input starts after what is needed")
        if r._next > -(-r.received * r.new // r.orig):
            raise ValueError("bad resampler state: output position is past the input")
        return r


_Count = Field(ge=0, le=1 << 53)  # a stream position: a non-negative int exact in float64


class ResamplerState(BaseModel):
    """Schema of `StreamResampler.state_dict()` (strict types, ranges checked).

    Also reads the earlier block-based layout (`buf_block`, `next_block`), whose positions are
    whole blocks of o inputs / n outputs of the same kernel.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    orig: int = Field(ge=MIN_SAMPLE_RATE, le=MAX_SAMPLE_RATE)
    new: int = Field(ge=MIN_SAMPLE_RATE, le=MAX_SAMPLE_RATE)
    buf: str = Field(max_length=64 << 20)
    start: int = _Count
    next: int = _Count
    received: int = _Count

    @classmethod
    def parse(cls, d: object) -> ResamplerState:
        """Validate a state dict (ValueError naming the bad field)."""
        if isinstance(d, dict) and "buf_block" in d and "start" not in d:
            d = _from_blocks(d)
        try:
            return cls.model_validate(d)
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(x) for x in err["loc"]) or "state"
            raise ValueError(f"bad resampler state: {where}: {err['msg']}") from None


def _from_blocks(d: dict) -> dict:
    """The earlier layout's block positions as sample positions."""
    out = {k: v for k, v in d.items() if k not in ("buf_block", "next_block")}
    try:
        g = math.gcd(int(d["orig"]), int(d["new"]))
        o, n = int(d["orig"]) // g, int(d["new"]) // g
        out["start"], out["next"] = int(d["buf_block"]) * o, int(d["next_block"]) * n
    except (KeyError, TypeError, ValueError, OverflowError, ZeroDivisionError):
        return d  # (the schema names what is wrong)
    return out


__all__ = [
    "MAX_SAMPLE_RATE",
    "MIN_SAMPLE_RATE",
    "SampleRateError",
    "ResamplerState",
    "StreamResampler",
    "check_rate",
]
