"""New speakers from the training voices: WORLD vocoder re-synthesis with a scaled pitch and a
warped spectral envelope (vocal-tract length), cached per voice.

Speed perturbation (``rooms.py``) moves pitch and formants together by at most 15 %, and VTLP
warps the formants only: neither turns a man's 110 Hz voice into a woman's 200 Hz one, and
women's voices are the ones held-out tests miss most (MODEL.md). A WORLD analysis (**pyworld**:
DIO + StoneMask pitch, CheapTrick envelope, D4C aperiodicity) separates pitch from envelope, so
each can be moved independently: ``f0`` multiplies the pitch contour, ``env`` stretches the
envelope and aperiodicity along frequency (``env > 1``: a shorter vocal tract, formants up).

Each training voice of a non-espeak engine gets ``n`` morphs drawn by a hash of (seed, voice
key), alternating up (pitch x1.35-1.8, formants x1.06-1.18: towards a woman's or a child's
voice) and down (pitch x0.6-0.8, formants x0.85-0.95). A morph is a `TTSVoice` with the source's
engine and speaker and its ``morph`` tag set, so it stays in the source's split (splits are by
speaker) and joins every per-voice report as itself. Morphs are made only from the voices a run
trains on (``recipes/kws.py``); a test voice is never morphed.

Cost: ~30-40 ms per word on one core; a voice runs in one worker process. Results are cached
beside the clean clips (``morph-*.npz``, keyed by the clean clips' key and the morph tag).
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import warnings
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from tqdm import tqdm

from training.data.audio import peak_normalize
from training.data.corpus import CorpusConfig, VoiceClips, cache_key
from training.data.labels import SAMPLE_RATE

FRAME_MS = 5.0  # WORLD analysis hop
PEAK = 0.9  # as the clean clips (corpus._PEAK)
MIN_SAMPLES = 1024  # shorter clips are copied unchanged
UP = ((1.35, 1.8), (1.06, 1.18))  # (pitch ratio range, envelope ratio range)
DOWN = ((0.6, 0.8), (0.85, 0.95))


@dataclass(frozen=True)
class Morph:
    """A pitch ratio and a spectral-envelope stretch."""

    f0: float
    env: float

    @property
    def tag(self) -> str:
        return f"f{self.f0:.2f}e{self.env:.2f}"


def morphs_for(voice_key: str, seed: int, n: int) -> list[Morph]:
    """The `n` morphs of a voice: up, down, up, ... with ratios from a hash (stable anywhere)."""
    out = []
    for j in range(n):
        h = hashlib.sha256(f"{seed}:{voice_key}:{j}".encode()).digest()
        u, v = h[0] / 255.0, h[1] / 255.0
        (f_lo, f_hi), (e_lo, e_hi) = UP if j % 2 == 0 else DOWN
        out.append(Morph(round(f_lo + u * (f_hi - f_lo), 2), round(e_lo + v * (e_hi - e_lo), 2)))
    return out


def _warp(a: np.ndarray, ratio: float) -> np.ndarray:
    """(T, F) spectra stretched along frequency by `ratio`: out[:, f] = a[:, f / ratio]."""
    bins = np.arange(a.shape[1], dtype=np.float64)
    src = np.clip(bins / ratio, 0, a.shape[1] - 1)
    lo = np.floor(src).astype(np.int64)
    hi = np.minimum(lo + 1, a.shape[1] - 1)
    w = src - lo
    return a[:, lo] * (1 - w) + a[:, hi] * w


def morph_clip(clip: np.ndarray, morph: Morph) -> np.ndarray:
    """One int16 16 kHz clip (N,) -> the morphed clip, int16, peak-normalised, about N long."""
    with warnings.catch_warnings():  # pyworld 0.3.5 imports the deprecated pkg_resources
        warnings.simplefilter("ignore", UserWarning)
        import pyworld

    if len(clip) < MIN_SAMPLES:
        return np.asarray(clip, np.int16).copy()
    x = clip.astype(np.float64) / 32767.0
    f0, t = pyworld.dio(x, SAMPLE_RATE, frame_period=FRAME_MS)
    f0 = pyworld.stonemask(x, f0, t, SAMPLE_RATE)
    sp = pyworld.cheaptrick(x, f0, t, SAMPLE_RATE)  # (T, F) envelope
    ap = pyworld.d4c(x, f0, t, SAMPLE_RATE)  # (T, F) aperiodicity
    sp = np.ascontiguousarray(_warp(sp, morph.env))
    ap = np.ascontiguousarray(np.clip(_warp(ap, morph.env), 0.0, 1.0))
    y = pyworld.synthesize(f0 * morph.f0, sp, ap, SAMPLE_RATE, FRAME_MS)
    y = peak_normalize(np.nan_to_num(y).astype(np.float32), PEAK)
    return np.round(np.clip(y, -1, 1) * 32767).astype(np.int16)


def morph_voice_of(vc: VoiceClips, morph: Morph) -> VoiceClips:
    """Every clip of `vc` morphed (runs in a worker); offsets follow the new lengths."""
    clips = [morph_clip(vc.audio[vc.offsets[i] : vc.offsets[i + 1]], morph) for i in range(len(vc))]
    lengths = np.array([len(c) for c in clips], np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    audio = np.concatenate(clips) if clips else np.zeros(0, np.int16)
    return VoiceClips(replace(vc.voice, morph=morph.tag), audio, offsets, vc.labels, vc.words)


def _path(cache_dir: Path, cfg: CorpusConfig, vc: VoiceClips, morph: Morph) -> Path:
    safe = vc.voice.name.replace("+", "_").replace("/", "_")
    key = cache_key(cfg, vc.voice)
    return cache_dir / f"morph-{morph.tag}-{vc.voice.engine}-{safe}-{key}.npz"


def _load(path: Path, vc: VoiceClips, morph: Morph) -> VoiceClips:
    with np.load(path, allow_pickle=False) as d:
        audio, offsets = d["audio"], d["offsets"]
    if len(offsets) != len(vc) + 1:
        raise ValueError(f"{path.name}: morph does not match its clean clips")
    return VoiceClips(replace(vc.voice, morph=morph.tag), audio, offsets, vc.labels, vc.words)


def _save(path: Path, out: VoiceClips) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.npz")
    np.savez(tmp, audio=out.audio, offsets=out.offsets)
    os.replace(tmp, path)


def morphed_voices(
    cache_dir: str | os.PathLike,
    cfg: CorpusConfig,
    sources: Sequence[VoiceClips],
    n: int,
    workers: int = 2,
    progress: bool = True,
) -> list[VoiceClips]:
    """`n` morphs of each source voice (made now where missing, a process per voice), in
    the order of `sources` then `morphs_for`."""
    if any(vc.voice.morph for vc in sources):
        raise ValueError("morphs are made from clean voices, not from other morphs")
    cache = Path(cache_dir)
    jobs = [
        (vc, m, _path(cache, cfg, vc, m))
        for vc in sources
        for m in morphs_for(vc.voice.key, cfg.seed, n)
    ]
    todo = [(vc, m, path) for vc, m, path in jobs if not path.exists()]
    if todo:
        methods = multiprocessing.get_all_start_methods()
        ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
        bar = tqdm(total=sum(len(vc) for vc, _, _ in todo), desc="morphs", unit="clip",
                   disable=not progress)  # fmt: skip
        with ProcessPoolExecutor(max(1, workers), mp_context=ctx) as pool:
            futs = {pool.submit(morph_voice_of, vc, m): (vc, path) for vc, m, path in todo}
            for fut in as_completed(futs):
                vc, path = futs[fut]
                _save(path, fut.result())
                bar.update(len(vc))
        bar.close()
    return [_load(path, vc, m) for vc, m, path in jobs]
