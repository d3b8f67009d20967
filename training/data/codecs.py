"""Lossy codec round trips (MP3, Opus) of whole voices, in bulk, cached: the microphone at the
other end of a browser, a phone or a voice-message app.

A process per clip would cost more than a training step, so each voice's clips go through
Debian's **ffmpeg** once: concatenated with 0.2 s of silence between them, encoded (libmp3lame
or libopus at a low bitrate), decoded, and cut back at the same offsets. ffmpeg's decoders
drop the encoders' delay and padding (LAME's gapless header, Opus pre-skip), so a clip keeps
its place to within a few samples (tested); the gap keeps one clip's pre-echo out of the next.

Each voice gets one codec setting drawn from `CODECS` by a hash of (seed, voice key), so the
corpus holds a spread of codecs and bitrates while each voice costs one ffmpeg run; results
are cached next to the clean clips (`codec-*.npz`, keyed by the clean cache key and the
setting). Training uses a coded copy of a word with probability `RoomConfig.codec_prob`
(`sc12.KWSWindows`), before the room and channel effects. A run renders the copies of its
training voices one after another; `python -m training.data.codecs --workers 2` renders every
voice's copy ahead in parallel (after the clean corpus), so runs started together find them.
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing as mp
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from training.data.corpus import (
    CorpusConfig,
    VoiceClips,
    accent_options,
    add_accent_args,
    cache_key,
    engines_for,
    generate,
)
from training.data.labels import SAMPLE_RATE

GAP = SAMPLE_RATE // 5  # silence between clips inside one encoded stream


@dataclass(frozen=True)
class Codec:
    """One lossy setting: an ffmpeg encoder, its container and bitrate."""

    name: str  # "mp3" | "opus"
    kbps: int

    @property
    def tag(self) -> str:
        return f"{self.name}{self.kbps}"

    def encode_args(self) -> list[str]:
        if self.name == "mp3":
            return ["-c:a", "libmp3lame", "-b:a", f"{self.kbps}k", "-f", "mp3"]
        if self.name == "opus":
            return ["-c:a", "libopus", "-b:a", f"{self.kbps}k", "-f", "ogg"]
        raise ValueError(f"unknown codec {self.name!r}")


# low bitrates (what voice over a network sounds like), a few of each codec
CODECS: tuple[Codec, ...] = (
    Codec("mp3", 24), Codec("mp3", 32), Codec("mp3", 48),
    Codec("opus", 8), Codec("opus", 12), Codec("opus", 16), Codec("opus", 24),
)  # fmt: skip


def available() -> bool:
    """ffmpeg is installed (scripts/setup.sh installs Debian's)."""
    return shutil.which("ffmpeg") is not None


def _ffmpeg(args: list[str], data: bytes) -> bytes:
    cmd = ["ffmpeg", "-hide_banner", "-loglevel", "error", "-nostdin", *args]
    out = subprocess.run(cmd, input=data, capture_output=True, timeout=600, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"ffmpeg failed: {out.stderr.decode(errors='replace').strip()}")
    return out.stdout


def roundtrip(audio: np.ndarray, codec: Codec) -> np.ndarray:
    """int16 mono 16 kHz samples (N,) -> the same length after encode + decode. The encoded
    stream goes through a file, not a pipe: the MP3 muxer writes LAME's delay/padding header
    only to seekable output (through a pipe every clip came back 1,105 samples late)."""
    raw = ["-f", "s16le", "-ar", str(SAMPLE_RATE), "-ac", "1"]
    with tempfile.TemporaryDirectory(prefix="dlr-codec-") as tmp:
        path = str(Path(tmp) / f"coded.{codec.name}")
        _ffmpeg([*raw, "-i", "pipe:0", *codec.encode_args(), "-y", path], audio.tobytes())
        pcm = _ffmpeg(["-i", path, *raw, "pipe:1"], b"")
    y = np.frombuffer(pcm, dtype="<i2")
    if len(y) < len(audio):  # (a few samples short at the very end: pad)
        y = np.concatenate([y, np.zeros(len(audio) - len(y), np.int16)])
    return np.ascontiguousarray(y[: len(audio)], dtype=np.int16)


def roundtrip_clips(clips: Sequence[np.ndarray], codec: Codec) -> list[np.ndarray]:
    """int16 clips through one encoded stream (0.2 s apart), cut back to their lengths."""
    if not clips:
        return []
    gap = np.zeros(GAP, np.int16)
    parts, starts, at = [gap], [], GAP
    for c in clips:
        starts.append(at)
        parts += [np.asarray(c, np.int16), gap]
        at += len(c) + GAP
    y = roundtrip(np.concatenate(parts), codec)
    return [y[s : s + len(c)].copy() for s, c in zip(starts, clips, strict=True)]


def codec_for(voice_key: str, seed: int) -> Codec:
    """The setting a voice gets (stable across runs and machines)."""
    h = hashlib.sha256(f"{seed}:{voice_key}".encode()).digest()
    return CODECS[h[0] % len(CODECS)]


def _path(cache_dir: Path, cfg: CorpusConfig, vc: VoiceClips, codec: Codec) -> Path:
    safe = vc.voice.name.replace("+", "_").replace("/", "_")
    key = cache_key(cfg, vc.voice)
    return cache_dir / f"codec-{codec.tag}-{vc.voice.engine}-{safe}-{key}.npz"


def coded_voice(cache_dir: str | os.PathLike, cfg: CorpusConfig, vc: VoiceClips) -> VoiceClips:
    """`vc` through its codec (`codec_for`), from the cache or made now (one ffmpeg run)."""
    codec = codec_for(vc.voice.key, cfg.seed)
    path = _path(Path(cache_dir), cfg, vc, codec)
    if not path.exists():
        clips = [vc.audio[vc.offsets[i] : vc.offsets[i + 1]] for i in range(len(vc))]
        coded = roundtrip_clips(clips, codec)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.npz")
        audio = np.concatenate(coded) if coded else np.zeros(0, np.int16)
        np.savez(tmp, audio=audio)
        os.replace(tmp, path)
    with np.load(path, allow_pickle=False) as d:
        audio = d["audio"]
    if len(audio) != int(vc.offsets[-1]):
        raise ValueError(f"{path.name}: coded audio does not match its clean clips")
    return VoiceClips(vc.voice, audio, vc.offsets, vc.labels, vc.words)


def _render(cache_dir: str, cfg: CorpusConfig, vc: VoiceClips) -> str:
    coded_voice(cache_dir, cfg, vc)
    return vc.voice.key


def render_all(
    cache_dir: str | os.PathLike, cfg: CorpusConfig, voices: Sequence[VoiceClips], workers: int
) -> list[str]:
    """Render the coded copy of each of `voices` into the cache (a process per voice at a
    time, `workers` at once); returns the voice keys, in order."""
    if not available():
        raise RuntimeError("ffmpeg is not installed (scripts/setup.sh installs it)")
    ctx = mp.get_context("spawn")  # (no forked copies of the loaded corpus)
    with ProcessPoolExecutor(max(1, workers), mp_context=ctx) as pool:
        jobs = [pool.submit(_render, str(cache_dir), cfg, vc) for vc in voices]
        return [job.result() for job in tqdm(jobs, "codecs", unit="voice")]


def main(argv: Sequence[str] | None = None) -> None:
    """CLI: render every voice's codec copy ahead of training."""
    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--cache-dir", default="runs/sc12cache")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--more-engines", action="store_true", help="also MBROLA, RHVoice and Pico")
    add_accent_args(p)
    args = p.parse_args(argv)
    cfg = CorpusConfig(
        seed=args.seed,
        engines=engines_for(args.more_engines),
        **accent_options(args),
    )
    clips = generate(cfg, args.cache_dir, args.workers)  # (renders what is missing)
    keys = render_all(args.cache_dir, cfg, list(clips.values()), args.workers)
    print(f"{len(keys)} voices have a codec copy in {args.cache_dir}")


if __name__ == "__main__":
    main()
