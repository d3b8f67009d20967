"""Offline substitute for Speech Commands SC10, synthesized with Debian's ``espeak-ng``.

Every SC10 keyword is spoken by many *voices*; a voice is an (accent, variant) pair such as
``en-gb-scotland+f2``. Each (voice, word) pair is rendered ``renditions`` times at a speaking rate
and pitch drawn deterministically from the seed. Splits are made by voice, so no test or valid
voice is ever heard in training.

Pipeline: espeak-ng (22050 Hz) -> resample to 16 kHz -> trim silence -> peak-normalise -> store
as int16 ("clean clips", cached on disk keyed by a hash of the generating config). The
:class:`SynthSpeechDataset` then augments on the fly (speed, gain, random offset inside a 1 s
window, coloured background noise) with a seed derived from (seed, split, epoch, index).

Command line: ``python -m training.data.speech_synth --out examples/`` writes a few example WAVs.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import multiprocessing
import os
import time
import zlib
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from training.data.audio import (
    AugmentConfig,
    augment_clip,
    peak_normalize,
    place_in_window,
    resample,
    trim_silence,
)
from training.data.espeak import (
    EspeakError,
    EspeakNotFoundError,
    espeak_synthesize,
    espeak_version,
    find_espeak,
)
from training.data.labels import CLIP_SAMPLES, SAMPLE_RATE, SC10_LABELS

__all__ = [
    "ACCENTS",
    "SC10_LABELS",
    "SPLITS",
    "VARIANTS",
    "ClipSet",
    "ClipSpec",
    "EspeakError",
    "EspeakNotFoundError",
    "SynthConfig",
    "SynthSpeechDataset",
    "Voice",
    "all_voices",
    "clip_specs",
    "generate_clips",
    "split_voices",
    "synthesize_clip",
    "synthesize_word",
    "write_examples",
]

#: English accents of espeak-ng used as the first half of a voice.
ACCENTS: tuple[str, ...] = (
    "en-us",
    "en-gb",
    "en-gb-scotland",
    "en-gb-x-rp",
    "en-gb-x-gbclan",
    "en-gb-x-gbcwmd",
    "en-029",
    "en-us-nyc",
)

#: espeak-ng voice variants (``espeak-ng --voices=variant``) that give distinct audio.
VARIANTS: tuple[str, ...] = (
    *(f"m{i}" for i in range(1, 8)),
    *(f"f{i}" for i in range(1, 6)),
    "klatt",
    "klatt2",
    "klatt3",
    "klatt4",
)

#: Split names, in the order of ``SynthConfig.split_fractions``.
SPLITS: tuple[str, ...] = ("train", "valid", "test")

# Bump when the clean-clip pipeline changes so stale caches are not reused.
_CACHE_VERSION = 1
# Peak level of stored clean clips.
_CLEAN_PEAK = 0.9


@dataclass(frozen=True, order=True)
class Voice:
    """An espeak-ng voice: an English accent combined with a voice variant."""

    accent: str
    variant: str

    @property
    def spec(self) -> str:
        """The ``-v`` argument for espeak-ng, e.g. ``"en-us+f2"``."""
        return f"{self.accent}+{self.variant}" if self.variant else self.accent

    @classmethod
    def parse(cls, spec: str) -> Voice:
        """Inverse of :attr:`spec`."""
        accent, _, variant = spec.partition("+")
        return cls(accent, variant)


@dataclass(frozen=True)
class SynthConfig:
    """Everything that determines the synthetic SC10 corpus and its augmentation."""

    # Master seed: voice split, per-clip speed/pitch draws and augmentation all derive from it.
    seed: int = 0
    # espeak-ng accents; voices are the cross product of accents and variants.
    accents: tuple[str, ...] = ACCENTS
    # espeak-ng voice variants (see ``espeak-ng --voices=variant``).
    variants: tuple[str, ...] = VARIANTS
    # Fractions of voices assigned to (train, valid, test).
    split_fractions: tuple[float, float, float] = (0.70, 0.15, 0.15)
    # Words to synthesize; labels are always the index in SC10_LABELS.
    words: tuple[str, ...] = SC10_LABELS
    # Number of clips per (voice, word), each with its own speed and pitch.
    renditions: int = 4
    # Inclusive range of the espeak speaking rate in words per minute.
    speed_wpm: tuple[int, int] = (120, 220)
    # Inclusive range of the espeak base pitch (0..99).
    pitch: tuple[int, int] = (30, 70)
    # Length in samples of the 16 kHz window returned by the dataset (1 s).
    clip_samples: int = CLIP_SAMPLES
    # On-the-fly augmentation used by SynthSpeechDataset when augment=True.
    augment: AugmentConfig = field(default_factory=AugmentConfig)

    def generation_key(self) -> str:
        """Hash of every field that affects the clean clips, plus the espeak-ng version."""
        fields = {
            "seed": self.seed,
            "accents": list(self.accents),
            "variants": list(self.variants),
            "split_fractions": list(self.split_fractions),
            "words": list(self.words),
            "renditions": self.renditions,
            "speed_wpm": list(self.speed_wpm),
            "pitch": list(self.pitch),
            "sample_rate": SAMPLE_RATE,
            "version": _CACHE_VERSION,
            "espeak": espeak_version(),
        }
        blob = json.dumps(fields, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


@dataclass(frozen=True)
class ClipSpec:
    """One clip to render: who says which word, how fast and at which pitch."""

    voice: str
    word: str
    label: int
    speed: int
    pitch: int


def all_voices(config: SynthConfig) -> list[Voice]:
    """Every (accent, variant) voice of ``config``, sorted."""
    return sorted(Voice(a, v) for a in config.accents for v in config.variants)


def split_voices(config: SynthConfig) -> dict[str, list[Voice]]:
    """Deterministically assign each voice to exactly one of ``SPLITS`` from ``config.seed``.

    Valid and test each get ``round(fraction * n)`` voices (at least one when there are three or
    more voices); train gets the rest.
    """
    voices = all_voices(config)
    n = len(voices)
    order = np.random.default_rng([config.seed, 0x5EED]).permutation(n)
    _, f_valid, f_test = config.split_fractions
    minimum = 1 if n >= 3 else 0
    n_valid = max(minimum, round(f_valid * n))
    n_test = max(minimum, round(f_test * n))
    n_train = n - n_valid - n_test
    if n_train < 1:
        raise ValueError(f"{n} voices are too few for split fractions {config.split_fractions}")
    picked = [voices[i] for i in order]
    return {
        "train": sorted(picked[:n_train]),
        "valid": sorted(picked[n_train : n_train + n_valid]),
        "test": sorted(picked[n_train + n_valid :]),
    }


def clip_specs(config: SynthConfig, split: str) -> list[ClipSpec]:
    """The clips of ``split`` in a fixed order: voice, then word, then rendition."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    specs = []
    for voice in split_voices(config)[split]:
        voice_id = zlib.crc32(voice.spec.encode())
        for word in config.words:
            label = SC10_LABELS.index(word)
            for r in range(config.renditions):
                rng = np.random.default_rng([config.seed, voice_id, label, r])
                speed = int(rng.integers(config.speed_wpm[0], config.speed_wpm[1] + 1))
                pitch = int(rng.integers(config.pitch[0], config.pitch[1] + 1))
                specs.append(ClipSpec(voice.spec, word, label, speed, pitch))
    return specs


def synthesize_word(
    word: str, voice: Voice | str = "en-us", speed: int = 160, pitch: int = 50
) -> np.ndarray:
    """Speak ``word`` with espeak-ng; return 16 kHz float32 audio, silence-trimmed, peak 0.9.

    Raises :class:`EspeakNotFoundError` when espeak-ng is not installed.
    """
    spec = voice.spec if isinstance(voice, Voice) else voice
    raw, rate = espeak_synthesize(word, spec, speed, pitch)
    audio = trim_silence(resample(raw, rate, SAMPLE_RATE), SAMPLE_RATE)
    return peak_normalize(audio, _CLEAN_PEAK)


def synthesize_clip(
    word: str,
    voice: Voice | str = "en-us",
    speed: int = 160,
    pitch: int = 50,
    offset: int | None = None,
    length: int = CLIP_SAMPLES,
) -> np.ndarray:
    """:func:`synthesize_word` placed in a ``length``-sample window (centred when offset=None)."""
    audio = synthesize_word(word, voice, speed, pitch)[:length]
    if offset is None:
        return place_in_window(audio, None, length)
    if not 0 <= offset <= length - len(audio):
        raise ValueError(f"offset {offset} does not fit a {len(audio)}-sample word in {length}")
    out = np.zeros(length, dtype=np.float32)
    out[offset : offset + len(audio)] = audio
    return out


@dataclass
class ClipSet:
    """Variable-length clean clips of one split, stored flat as int16."""

    split: str  # split name the clips belong to
    audio: np.ndarray  # int16 [total_samples], all clips concatenated
    offsets: np.ndarray  # int64 [N + 1], clip i is audio[offsets[i]:offsets[i + 1]]
    labels: np.ndarray  # int64 [N], index into SC10_LABELS
    voices: np.ndarray  # str [N], voice spec of each clip
    speeds: np.ndarray  # int64 [N], espeak words-per-minute
    pitches: np.ndarray  # int64 [N], espeak pitch

    def __len__(self) -> int:
        return len(self.labels)

    def clip(self, index: int) -> np.ndarray:
        """Clean clip ``index`` as float32 in [-1, 1] (16 kHz, variable length)."""
        chunk = self.audio[self.offsets[index] : self.offsets[index + 1]]
        return chunk.astype(np.float32) / 32767.0

    def save(self, path: Path) -> None:
        """Write to ``path`` (.npz) atomically."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.npz")
        arrays = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        arrays["split"] = np.array(self.split)
        np.savez(tmp, **arrays)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> ClipSet:
        """Read a file written by :meth:`save`."""
        with np.load(path, allow_pickle=False) as data:
            values = {f.name: data[f.name] for f in dataclasses.fields(cls)}
        values["split"] = str(values["split"])
        return cls(**values)


def _render(spec: ClipSpec) -> np.ndarray:
    """Render one clean clip as int16 (runs inside pool workers)."""
    audio = synthesize_word(spec.word, spec.voice, spec.speed, spec.pitch)
    return np.round(np.clip(audio, -1.0, 1.0) * 32767.0).astype(np.int16)


def _worker_init() -> None:
    # One intra-op thread per worker: the pool already uses every core.
    torch.set_num_threads(1)


def _render_all(specs: Sequence[ClipSpec], workers: int) -> list[np.ndarray]:
    if workers <= 1 or len(specs) < 4 * workers:
        return [_render(s) for s in specs]
    chunk = max(1, len(specs) // (workers * 8))
    # fork (as torch's DataLoader does) avoids re-importing __main__ in every worker.
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_worker_init) as pool:
        return list(pool.map(_render, specs, chunksize=chunk))


def generate_clips(
    config: SynthConfig,
    split: str,
    cache_dir: str | os.PathLike | None = None,
    workers: int | None = None,
) -> ClipSet:
    """Render (or load from ``cache_dir``) the clean clips of ``split``.

    The cache file is ``<cache_dir>/sc10synth-<split>-<config.generation_key()>.npz``. Rendering
    runs on a process pool of ``workers`` processes (default ``os.cpu_count()``); very small jobs
    are rendered in-process.
    """
    find_espeak()
    path = None
    if cache_dir is not None:
        path = Path(cache_dir) / f"sc10synth-{split}-{config.generation_key()}.npz"
        if path.exists():
            return ClipSet.load(path)
    specs = clip_specs(config, split)
    rendered = _render_all(specs, (os.cpu_count() or 1) if workers is None else workers)
    lengths = np.array([len(a) for a in rendered], dtype=np.int64)
    clips = ClipSet(
        split=split,
        audio=np.concatenate(rendered) if rendered else np.zeros(0, np.int16),
        offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        labels=np.array([s.label for s in specs], dtype=np.int64),
        voices=np.array([s.voice for s in specs], dtype=str),
        speeds=np.array([s.speed for s in specs], dtype=np.int64),
        pitches=np.array([s.pitch for s in specs], dtype=np.int64),
    )
    if path is not None:
        clips.save(path)
    return clips


class SynthSpeechDataset(Dataset):
    """Windowed, augmented synthetic SC10 clips: items are ``(float32 [clip_samples], label)``.

    Augmentation is seeded by (config.seed, split, epoch, index), so an item is reproducible;
    call :meth:`set_epoch` each epoch for fresh augmentation (with non-persistent DataLoader
    workers the new epoch reaches the workers). With ``augment=False`` the clean clip is only
    placed at a random, index-seeded offset.
    """

    def __init__(self, clips: ClipSet, config: SynthConfig, augment: bool = True) -> None:
        self.clips = clips
        self.config = config
        self.augment = augment
        self.epoch = 0
        self._split_id = SPLITS.index(clips.split) if clips.split in SPLITS else 99

    @classmethod
    def from_config(
        cls,
        config: SynthConfig,
        split: str,
        cache_dir: str | os.PathLike | None = None,
        augment: bool | None = None,
        workers: int | None = None,
    ) -> SynthSpeechDataset:
        """Generate/load ``split`` and wrap it; ``augment`` defaults to ``split == "train"``."""
        clips = generate_clips(config, split, cache_dir, workers)
        return cls(clips, config, split == "train" if augment is None else augment)

    def set_epoch(self, epoch: int) -> None:
        """Select the augmentation stream of ``epoch``."""
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.clips)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if not 0 <= index < len(self):
            raise IndexError(index)
        rng = np.random.default_rng([self.config.seed, self._split_id, self.epoch, index])
        clean = self.clips.clip(index)
        if self.augment:
            wave = augment_clip(clean, self.config.augment, rng, self.config.clip_samples)
        else:
            wave = place_in_window(clean, rng, self.config.clip_samples)
        return torch.from_numpy(wave), int(self.clips.labels[index])


def write_examples(
    out_dir: str | os.PathLike,
    config: SynthConfig | None = None,
    count: int = 10,
    split: str = "train",
    augment: bool = True,
) -> list[Path]:
    """Write ``count`` windowed example clips of ``split`` as 16 kHz WAVs; return their paths."""
    import soundfile as sf

    config = config or SynthConfig()
    specs = clip_specs(config, split)
    picks = np.random.default_rng(config.seed).choice(len(specs), size=count, replace=False)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for n, i in enumerate(sorted(picks.tolist())):
        spec = specs[i]
        clean = synthesize_word(spec.word, spec.voice, spec.speed, spec.pitch)
        rng = np.random.default_rng([config.seed, n])
        if augment:
            wave = augment_clip(clean, config.augment, rng, config.clip_samples)
        else:
            wave = place_in_window(clean, rng, config.clip_samples)
        path = out / f"{n:03d}_{spec.word}_{spec.voice}_s{spec.speed}_p{spec.pitch}.wav"
        sf.write(path, wave, SAMPLE_RATE, subtype="PCM_16")
        paths.append(path)
    return paths


def main(argv: Sequence[str] | None = None) -> None:
    """CLI: write example WAVs, optionally pre-generate (and time) the cached splits."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/sc10synth_examples", help="example WAV folder")
    parser.add_argument("--count", type=int, default=10, help="number of example WAVs")
    parser.add_argument("--split", default="train", choices=SPLITS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", default=None, help="also generate and cache all splits")
    args = parser.parse_args(argv)
    config = SynthConfig(seed=args.seed)
    for path in write_examples(args.out, config, args.count, args.split):
        print(path)
    if args.cache_dir:
        for split in SPLITS:
            start = time.perf_counter()
            clips = generate_clips(config, split, args.cache_dir)
            secs = time.perf_counter() - start
            print(f"{split}: {len(clips)} clips in {secs:.1f}s")


if __name__ == "__main__":
    main()
