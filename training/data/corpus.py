"""The clean multi-synthesizer SC12 corpus: who says which word, rendered once and cached.

Voices: espeak-ng (every accent x variant of ``speech_synth``; its *speaker* is the variant, so
all accents of ``+f3`` are one speaker and never split apart), flite (kal, kal16, awb, rms, slt)
and festival (kal_diphone, ked_diphone, cmu_us_slt_arctic_hts, and ten voices of other
languages reading English with their accent), Kokoro-82M (five voices and mixes of them) and
Piper (joe), the neural voices of ``neural_tts.py``; with ``--more-engines`` also MBROLA (twenty
recorded speakers through espeak-ng, sixteen of them reading English with another language's
accent; with ``--mbrola-accents`` 28 more reading respelled English), RHVoice (six; with
``--rhvoice-accents`` 26 more people reading English with their own language's accent) and
SVOX Pico (two; with ``--pico-accents`` four more women, its voices of other languages) from
Debian's contrib / non-free components. See ``engines.py`` for the speakers shared across
engines (kal, slt, awb) and the respelling the accented voices are given.

Words: the ten commands (several renditions per voice at a speaking rate and pitch drawn from
the seed) and the ``_unknown_`` words of ``vocab.py`` (every word for each flite/festival voice;
a seeded sample per voice of the other engines, so each word is heard from many voices).

Pipeline per clip: engine -> resample to 16 kHz (torchaudio) -> trim silence -> peak 0.9 ->
int16. Clips are cached per voice in ``<cache_dir>/clean-<engine>-<voice>-<key>.npz`` where the
key hashes every input (seed, words, ranges, engine version); generation runs on a process pool
(one job per espeak voice, batches of words per flite/festival voice) with a tqdm bar, and the
result does not depend on the number of workers.

CLI: ``python -m training.data.corpus --cache-dir runs/sc12cache --workers 2 [--more-engines]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import zlib
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from tqdm import tqdm

from training.data import neural_tts
from training.data.audio import peak_normalize, resample, trim_silence
from training.data.engines import (
    FESTIVAL_VOICES,
    FLITE_VOICES,
    KOKORO_ACCENT_VOICES,
    KOKORO_EXTRA_VOICES,
    KOKORO_VOICES,
    MBROLA_ACCENTED,
    MBROLA_VOICES,
    MORE_ENGINES,
    PICO_ACCENTED,
    PICO_VOICES,
    PIPER_VOICES,
    RHVOICE_ACCENTED,
    RHVOICE_VOICES,
    UNSAYABLE,
    TTSVoice,
    can_vary_rate,
    engine_text,
    engine_version,
    espeak_word,
    festival_batch,
    flite_synthesize,
    mbrola_word,
    mbrola_word_or_fallback,
    pico_synthesize,
    rhvoice_synthesize,
)
from training.data.labels import SAMPLE_RATE, SC10_LABELS
from training.data.speech_synth import ACCENTS, VARIANTS
from training.data.vocab import SC12_LABELS, UNKNOWN, unknown_words

_CACHE_VERSION = 1
#: Piper's noise is seeded once per rendered batch (``neural_tts.PiperVoice``), so its clips
#: depend on how its items are cut into jobs: that size is fixed here and part of its cache key.
_PIPER_BATCH = 120
_PEAK = 0.9
#: Engines whose voices read a sample of the unknown words (not every word, as flite and
#: festival do): slow ones, and the many MBROLA / RHVoice / Pico voices.
_SAMPLED_UNKNOWN = ("kokoro", "piper", *MORE_ENGINES)
#: Typical mean pitch (Hz) of each flite speaker; renditions scale it.
_FLITE_F0 = {"kal": 105.0, "awb": 115.0, "rms": 100.0, "slt": 170.0}


@dataclass(frozen=True)
class CorpusConfig:
    """Everything that determines the clean clips."""

    seed: int = 0  # master seed: rates, pitches and espeak's unknown-word samples
    accents: tuple[str, ...] = ACCENTS  # espeak-ng accents
    variants: tuple[str, ...] = VARIANTS  # espeak-ng variants (each one speaker)
    engines: tuple[str, ...] = ("espeak", "flite", "festival", "kokoro", "piper")  # to render
    espeak_command_renditions: int = 3  # clips per (espeak voice, command)
    espeak_unknown_per_voice: int = 40  # unknown words sampled per espeak voice
    command_renditions: int = 12  # clips per (flite/festival/neural voice, command)
    unknown_renditions: int = 2  # clips per (flite/festival voice, unknown word)
    neural_unknown_per_voice: int = 200  # unknown words sampled per kokoro/piper voice
    espeak_wpm: tuple[int, int] = (110, 230)  # espeak speaking-rate range
    espeak_pitch: tuple[int, int] = (20, 80)  # espeak base-pitch range (0..99)
    stretch: tuple[float, float] = (0.8, 1.35)  # flite/festival duration-stretch range
    neural_speed: tuple[float, float] = (0.75, 1.25)  # kokoro speed, 1 / piper length scale
    piper_noise: tuple[float, float] = (0.4, 0.9)  # piper noise scale (rendition variety)
    f0_scale: tuple[float, float] = (0.8, 1.25)  # flite pitch range, relative to the speaker
    unknown: tuple[str, ...] = field(default_factory=unknown_words)  # the _unknown_ words
    kokoro_extra: bool = False  # also the extra Kokoro mixes (neural_tts.KOKORO_EXTRA_BLENDS)
    kokoro_accents: bool = False  # also Kokoro voices reading other accents (KOKORO_ACCENTED)
    rhvoice_accents: bool = False  # also RHVoice's voices of other languages (RHVOICE_ACCENTED)
    pico_accents: bool = False  # also Pico's voices of other languages (PICO_ACCENTED)
    mbrola_accents: bool = False  # also more MBROLA speakers of other languages (MBROLA_ACCENTED)
    commands: bool = True  # the command clips (False: a layer of unknown words alone, e.g.
    # near_miss_layer's)

    def __post_init__(self) -> None:
        if self.rhvoice_accents and "rhvoice" not in self.engines:
            raise ValueError("rhvoice_accents needs the RHVoice engine (--more-engines)")
        if self.pico_accents and "pico" not in self.engines:
            raise ValueError("pico_accents needs the Pico engine (--more-engines)")
        if self.mbrola_accents and "mbrola" not in self.engines:
            raise ValueError("mbrola_accents needs the MBROLA engine (--more-engines)")


#: The opt-in sets of accented speakers of the contrib / non-free engines: the CorpusConfig
#: field (also the command-line flag, with dashes) and what it adds.
ACCENT_SETS = {
    "rhvoice_accents": "RHVoice's voices of other languages reading English",
    "pico_accents": "Pico's voices of other languages reading English",
    "mbrola_accents": "28 more MBROLA speakers reading respelled English",
}


def add_accent_args(p: argparse.ArgumentParser) -> None:
    """The ``--rhvoice-accents`` / ``--pico-accents`` / ``--mbrola-accents`` flags."""
    for name, what in ACCENT_SETS.items():
        p.add_argument(
            "--" + name.replace("_", "-"),
            action="store_true",
            help=f"with --more-engines: also {what}",
        )


def accent_options(args: argparse.Namespace) -> dict[str, bool]:
    """The CorpusConfig fields of :func:`add_accent_args`'s flags."""
    return {name: vars(args)[name] for name in ACCENT_SETS}


#: Unknown words per voice of the near-miss layer: espeak-ng voices, then the sampled engines
#: (Kokoro, Piper and the contrib / non-free ones); flite and festival say every word once.
NEAR_MISS_LAYER_SAMPLES = (20, 60)


def near_miss_layer(cfg: CorpusConfig, words: tuple[str, ...]) -> CorpusConfig:
    """The corpus of extra ``_unknown_`` words (``near_misses.py``'s, for training only) of
    `cfg`'s voices: no commands, `words` as the unknown words, a sample per voice (flite and
    festival: each word once). Its clips are cached apart from the main corpus's (their own
    key), so adding the layer re-renders nothing."""
    n_espeak, n_sampled = NEAR_MISS_LAYER_SAMPLES
    return replace(
        cfg,
        commands=False,
        unknown=words,
        espeak_unknown_per_voice=min(n_espeak, len(words)),
        neural_unknown_per_voice=min(n_sampled, len(words)),
        unknown_renditions=1,
    )


def engines_for(more_engines: bool) -> tuple[str, ...]:
    """The engines a corpus renders: the default five, and with ``more_engines`` also
    :data:`~training.data.engines.MORE_ENGINES`."""
    return CorpusConfig().engines + (MORE_ENGINES if more_engines else ())


@dataclass(frozen=True)
class ClipItem:
    """One clip to render: the word, its label and the engine's rate/pitch settings."""

    word: str
    label: int  # index into SC12_LABELS
    rate: float  # espeak wpm, duration stretch (flite, festival, piper) or kokoro speed
    pitch: float  # espeak pitch, flite f0 (Hz) or piper noise scale; 0 otherwise


def all_tts_voices(cfg: CorpusConfig) -> list[TTSVoice]:
    """Every voice of the configured engines, sorted."""
    out: list[TTSVoice] = []
    if "espeak" in cfg.engines:
        out += [
            TTSVoice("espeak", f"{a}+{v}", f"espeak-{v}") for a in cfg.accents for v in cfg.variants
        ]
    if "flite" in cfg.engines:
        out += list(FLITE_VOICES)
    if "festival" in cfg.engines:
        out += list(FESTIVAL_VOICES)
    if "kokoro" in cfg.engines:
        out += list(KOKORO_VOICES) + (list(KOKORO_EXTRA_VOICES) if cfg.kokoro_extra else [])
        out += list(KOKORO_ACCENT_VOICES) if cfg.kokoro_accents else []
    if "piper" in cfg.engines:
        out += list(PIPER_VOICES)
    if "mbrola" in cfg.engines:
        out += list(MBROLA_VOICES) + (list(MBROLA_ACCENTED) if cfg.mbrola_accents else [])
    if "rhvoice" in cfg.engines:
        out += list(RHVOICE_VOICES) + (list(RHVOICE_ACCENTED) if cfg.rhvoice_accents else [])
    if "pico" in cfg.engines:
        out += list(PICO_VOICES) + (list(PICO_ACCENTED) if cfg.pico_accents else [])
    return sorted(out)


def voice_items(cfg: CorpusConfig, voice: TTSVoice) -> list[ClipItem]:
    """The clips of one voice in a fixed order (commands, then unknown words)."""
    vid = zlib.crc32(voice.key.encode())
    rng = np.random.default_rng([cfg.seed, vid])
    items: list[ClipItem] = []
    unk = SC12_LABELS.index(UNKNOWN)
    commands = SC10_LABELS if cfg.commands else ()
    if voice.engine == "espeak":
        for word in commands:
            for _ in range(cfg.espeak_command_renditions):
                items.append(ClipItem(word, SC12_LABELS.index(word), *_espeak_rate(cfg, rng)))
        pick = rng.choice(len(cfg.unknown), cfg.espeak_unknown_per_voice, replace=False)
        for i in sorted(pick.tolist()):
            items.append(ClipItem(cfg.unknown[i], unk, *_espeak_rate(cfg, rng)))
        return items
    varies = can_vary_rate(voice)
    reps = cfg.command_renditions if varies else 1
    for word in commands:
        for _ in range(reps):
            items.append(ClipItem(word, SC12_LABELS.index(word), *_other_rate(cfg, voice, rng)))
    if voice.engine in _SAMPLED_UNKNOWN:  # ~0.5 s per word for kokoro: a sample, as espeak
        n = min(cfg.neural_unknown_per_voice, len(cfg.unknown))
        gaps = UNSAYABLE.get(voice.key, frozenset())  # drawn, then left out: the rest as before
        for i in sorted(rng.choice(len(cfg.unknown), n, replace=False).tolist()):
            item = ClipItem(cfg.unknown[i], unk, *_other_rate(cfg, voice, rng))
            if item.word not in gaps:
                items.append(item)
        return items
    for word in cfg.unknown:
        for _ in range(cfg.unknown_renditions if varies else 1):
            items.append(ClipItem(word, unk, *_other_rate(cfg, voice, rng)))
    return items


def _espeak_rate(cfg: CorpusConfig, rng: np.random.Generator) -> tuple[float, float]:
    wpm = int(rng.integers(cfg.espeak_wpm[0], cfg.espeak_wpm[1] + 1))
    return float(wpm), float(rng.integers(cfg.espeak_pitch[0], cfg.espeak_pitch[1] + 1))


def _other_rate(
    cfg: CorpusConfig, voice: TTSVoice, rng: np.random.Generator
) -> tuple[float, float]:
    if voice.engine == "kokoro":
        return round(float(rng.uniform(*cfg.neural_speed)), 3), 0.0
    if voice.engine == "piper":
        length = round(1.0 / float(rng.uniform(*cfg.neural_speed)), 3)
        return length, round(float(rng.uniform(*cfg.piper_noise)), 3)
    if voice.engine == "mbrola":  # espeak-ng drives it: words per minute and pitch
        return _espeak_rate(cfg, rng)
    if voice.engine in ("rhvoice", "pico"):  # duration stretch and a pitch scale
        stretch = round(float(rng.uniform(*cfg.stretch)), 3)
        return stretch, round(float(rng.uniform(*cfg.f0_scale)), 3)
    stretch = round(float(rng.uniform(*cfg.stretch)), 3) if can_vary_rate(voice) else 1.0
    if voice.engine == "flite":
        return stretch, round(_FLITE_F0[voice.speaker] * float(rng.uniform(*cfg.f0_scale)), 1)
    return stretch, 0.0


def cache_key(cfg: CorpusConfig, voice: TTSVoice) -> str:
    """Hash of every input of this voice's clips (a morph's: its source's and its tag)."""
    if voice.morph:
        blob = f"{cache_key(cfg, replace(voice, morph=''))}~{voice.morph}".encode()
        return hashlib.sha256(blob).hexdigest()[:16]
    items = voice_items(cfg, voice)
    inputs = {
        "v": _CACHE_VERSION,
        "voice": voice.key,
        "items": [(i.word, i.label, i.rate, i.pitch) for i in items],
        "engine": engine_version(voice.engine),
        "rate": SAMPLE_RATE,
    }
    if voice.engine == "piper":
        inputs["batch"] = _PIPER_BATCH
    if voice.lang != "en":  # what the accented voice reads (English voices read the word)
        inputs["texts"] = [engine_text(voice, i.word) for i in items]
    blob = json.dumps(inputs, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


@dataclass
class VoiceClips:
    """The clean clips of one voice, stored flat as int16."""

    voice: TTSVoice
    audio: np.ndarray  # int16 [total]
    offsets: np.ndarray  # int64 [N + 1]
    labels: np.ndarray  # int64 [N], SC12 index
    words: np.ndarray  # str [N]

    def __len__(self) -> int:
        return len(self.labels)

    def clip(self, i: int) -> np.ndarray:
        """Clip ``i`` as float32 (16 kHz)."""
        return self.audio[self.offsets[i] : self.offsets[i + 1]].astype(np.float32) / 32767.0


def _to_int16(audio: np.ndarray, rate: int) -> np.ndarray:
    a = trim_silence(resample(np.asarray(audio, np.float32), rate, SAMPLE_RATE), SAMPLE_RATE)
    a = peak_normalize(a, _PEAK)
    return np.round(np.clip(a, -1, 1) * 32767).astype(np.int16)


def render_items(voice: TTSVoice, items: Sequence[ClipItem]) -> list[np.ndarray]:
    """Render ``items`` of ``voice`` (runs in pool workers); int16 16 kHz clips."""
    import torch

    torch.set_num_threads(1)
    if voice.engine == "festival":
        raw = festival_batch(voice.name, [(engine_text(voice, i.word), i.rate) for i in items])
    elif voice.engine == "flite":
        raw = [flite_synthesize(i.word, voice.name, i.rate, i.pitch) for i in items]
    elif voice.engine == "kokoro":
        raw = [neural_tts.kokoro_synthesize(i.word, voice.name, i.rate) for i in items]
    elif voice.engine == "piper":
        seed = zlib.crc32(json.dumps([voice.key, items[0].word, items[0].rate]).encode())
        piper = neural_tts.PiperVoice(voice.name, seed)  # noise seeded per batch of items
        raw = [piper(i.word, i.rate, i.pitch) for i in items]
    elif voice.engine == "mbrola":
        say = mbrola_word_or_fallback if voice.lang != "en" else mbrola_word
        raw = [
            say(engine_text(voice, i.word), voice.name, int(i.rate), int(i.pitch)) for i in items
        ]
    elif voice.engine == "rhvoice":
        raw = [
            rhvoice_synthesize(engine_text(voice, i.word), voice.name, i.rate, i.pitch)
            for i in items
        ]
    elif voice.engine == "pico":
        raw = [
            pico_synthesize(engine_text(voice, i.word), voice.name, i.rate, i.pitch) for i in items
        ]
    else:
        raw = [espeak_word(i.word, voice.name, int(i.rate), int(i.pitch)) for i in items]
    return [_to_int16(a, r) for a, r in raw]


def _path(cache_dir: Path, cfg: CorpusConfig, voice: TTSVoice) -> Path:
    safe = voice.name.replace("+", "_").replace("/", "_")
    return cache_dir / f"clean-{voice.engine}-{safe}-{cache_key(cfg, voice)}.npz"


def is_rendered(cache_dir: Path, cfg: CorpusConfig, voice: TTSVoice) -> bool:
    """Whether ``voice``'s clips under ``cfg`` are in ``cache_dir`` (for :func:`load_voice`)."""
    return _path(cache_dir, cfg, voice).exists()


def load_voice(cache_dir: Path, cfg: CorpusConfig, voice: TTSVoice) -> VoiceClips:
    """Read one voice's cached clips (generate them first with :func:`generate`)."""
    with np.load(_path(cache_dir, cfg, voice), allow_pickle=False) as d:
        return VoiceClips(voice, d["audio"], d["offsets"], d["labels"], d["words"])


def _save(path: Path, voice: TTSVoice, items: Sequence[ClipItem], clips: list[np.ndarray]) -> None:
    lengths = np.array([len(c) for c in clips], np.int64)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.npz")
    np.savez(
        tmp,
        audio=np.concatenate(clips) if clips else np.zeros(0, np.int16),
        offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        labels=np.array([i.label for i in items], np.int64),
        words=np.array([i.word for i in items], dtype=str),
    )
    os.replace(tmp, path)


def generate(
    cfg: CorpusConfig,
    cache_dir: str | os.PathLike,
    workers: int = 2,
    voices: Sequence[TTSVoice] | None = None,
    progress: bool = True,
    batch: int = 120,
) -> dict[str, VoiceClips]:
    """Render every missing voice into ``cache_dir``; return all voices' clips by voice key."""
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    voices = list(voices) if voices is not None else all_tts_voices(cfg)
    todo = [v for v in voices if not is_rendered(cache, cfg, v)]
    if any(v.engine == "kokoro" for v in todo):
        neural_tts.kokoro_model_file(cache)  # assembled once, before the workers fork
    jobs: list[tuple[TTSVoice, int, list[ClipItem]]] = []
    for v in todo:
        items = voice_items(cfg, v)
        size = {"espeak": len(items), "piper": _PIPER_BATCH}.get(v.engine, batch)
        jobs += [(v, s, items[s : s + size]) for s in range(0, len(items), size)]
    parts: dict[str, dict[int, list[np.ndarray]]] = {v.key: {} for v in todo}
    if jobs:
        methods = multiprocessing.get_all_start_methods()
        ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
        bar = tqdm(
            total=sum(len(j[2]) for j in jobs), desc="clips", unit="clip", disable=not progress
        )
        with ProcessPoolExecutor(max(1, workers), mp_context=ctx) as pool:
            futs = {pool.submit(render_items, v, items): (v, s, len(items)) for v, s, items in jobs}
            for fut in as_completed(futs):
                v, s, n = futs[fut]
                parts[v.key][s] = fut.result()
                bar.update(n)
                if sum(len(p) for p in parts[v.key].values()) == len(voice_items(cfg, v)):
                    ordered = [c for k in sorted(parts[v.key]) for c in parts[v.key][k]]
                    _save(_path(cache, cfg, v), v, voice_items(cfg, v), ordered)
        bar.close()
    return {v.key: load_voice(cache, cfg, v) for v in voices}


def main(argv: Sequence[str] | None = None) -> None:
    """CLI: render (or check) the whole cache and print its size."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cache-dir", default="runs/sc12cache")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kokoro-extra", action="store_true", help="also the extra Kokoro mixes")
    p.add_argument(
        "--kokoro-accents", action="store_true", help="also Kokoro voices reading other accents"
    )
    p.add_argument(
        "--more-engines",
        action="store_true",
        help="also MBROLA, RHVoice and SVOX Pico (Debian contrib / non-free; scripts/setup.sh)",
    )
    add_accent_args(p)
    args = p.parse_args(argv)
    cfg = CorpusConfig(
        seed=args.seed,
        kokoro_extra=args.kokoro_extra,
        kokoro_accents=args.kokoro_accents,
        engines=engines_for(args.more_engines),
        **accent_options(args),
    )
    clips = generate(cfg, args.cache_dir, args.workers)
    by_engine: dict[str, list[int]] = {}
    for vc in clips.values():
        n_cmd = int((vc.labels < len(SC10_LABELS)).sum())
        e = by_engine.setdefault(vc.voice.engine, [0, 0, 0, 0])
        e[0] += 1
        e[1] += n_cmd
        e[2] += len(vc) - n_cmd
        e[3] += len(vc.audio)
    for engine, (nv, nc, nu, ns) in sorted(by_engine.items()):
        print(
            f"{engine}: {nv} voices, {nc} command clips, {nu} unknown clips, {ns / SAMPLE_RATE / 60:.1f} min"
        )


if __name__ == "__main__":
    main()
