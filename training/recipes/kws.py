"""Keyword spotting (SC12: ten commands + ``_silence_`` + ``_unknown_``) for continuous streams.

Data: the multi-synthesizer corpus (espeak-ng, flite, festival, Kokoro, Piper;
``training.data.corpus``) split by speaker (``training.data.splits``; ``--split final`` or a
leave-one-synthesizer-out preset), windows with per-frame targets and room/microphone
augmentation (``training.data.sc12``); with ``--morphs N``, N WORLD re-syntheses of each
non-espeak training voice at a new pitch and vocal-tract length (``training.data.morph``).

Model: causal DLR classifier with a per-frame front end (``--frontend logmel``: a log-mel
spectrum of each 20 ms frame, or ``raw`` samples as in the paper) and an exponentially weighted
pooling head (``--pool-window-s``; 0 gives the paper's running mean). Loss: cross-entropy at
every frame with a target (see ``sc12.py``), so the model says a word shortly after it ends and
``_silence_`` otherwise; with ``--peak-loss-weight``, plus a loss on each word's peak smoothed
posterior, the detector's own decision value, and with ``--false-peak-loss-weight`` a loss on the
highest smoothed command posterior over silence and unknown words (``training/peak_loss.py``);
with ``--invariance-weight``, plus the share of the scored features' variance that lies between
the words' engines, so that an engine's signature is not what the classifier reads
(``training/invariance.py``); with ``--phoneme-loss-weight``, plus a CTC loss of a second,
training-only head that spells each window's words in phonemes from the last block's per-frame
features (``training/phoneme_loss.py``), so the network learns what was said beyond twelve
classes; with ``--p-pair``, that share of the word windows is a minimal pair, a command and one
of its near misses said by the same voice under the same effects (``sc12.py``), and with
``--pair-loss-weight`` a margin loss asks that the command's log-odds against ``_unknown_`` be
higher on the command than on its near miss (``training/pair_loss.py``). The front end's mel
filterbank is warped per window during training (vocal-tract-length perturbation), and with ``--freq-masks`` / ``--time-masks`` spans
of mel bands and frames are masked (SpecAugment, ``training.spec_augment``); the shipped front
end is unwarped and unmasked.

Validation/selection metric: last-frame accuracy on 1.5 s clips of the valid speakers (commands,
unknown words, word-less windows), which is what the server's utterance mode reports; with
``--select command_accuracy``, the accuracy on the valid commands alone (unknown words and
silence are most of the clips, so accuracy can keep an early checkpoint that rejects the
commands of unfamiliar voices).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader
from tqdm import tqdm

from dlr_runtime import DLRModel, save_checkpoint, to_recurrent
from dlr_runtime.config import FRONTENDS, PCEN_FRONTENDS
from dlr_runtime.frontend import LogMel, mel_filterbank
from dlr_runtime.kws import KWSConfig
from dlr_runtime.model import frames_of
from dlr_runtime.speech_embedding import EMBED_STRIDE, EMBED_WINDOW
from training.config import TrainConfig
from training.data import codecs, morph
from training.data.corpus import (
    CorpusConfig,
    all_tts_voices,
    engines_for,
    generate,
    near_miss_layer,
)
from training.data.labels import SAMPLE_RATE
from training.data.near_misses import extra_words
from training.data.phonemes import PhonemeTable, load_table
from training.data.rooms import RoomConfig, rir_bank
from training.data.sc12 import (
    IGNORE,
    SIL,
    UNK,
    KWSItem,
    KWSWindows,
    WindowConfig,
    WordPool,
    clip_windows,
    silence_windows,
)
from training.data.splits import check_disjoint, split_voices
from training.data.vocab import SC12_LABELS, unknown_words
from training.distributed import DistContext, ShardedSampler
from training.invariance import InvarianceConfig, domain_share
from training.modelopts import ModelOptions
from training.pair_loss import PairLossConfig, margin_loss, pair_gaps
from training.peak_loss import (
    PeakLossConfig,
    false_peak_loss,
    peak_span_loss,
    smoothed_softmax,
)
from training.phoneme_loss import PhonemeHead, PhonemeLossConfig, phoneme_ctc_loss
from training.spec_augment import SpecAugmentConfig, spec_augment
from training.streams import build_stream, scores_after_context
from training.trainer import Recipe

TASK = "keyword-spotting-sc12"
SELECT_METRICS = ("accuracy", "command_accuracy")  # --select: valid metrics, higher is better


@dataclass
class KWSOptions:
    cache_dir: str = "runs/sc12cache"  # clean-clip and room-impulse-response cache
    split: str = "final"  # final | loso-<engine> (training.data.splits.PRESETS)
    workers: int = 2  # processes rendering missing clips
    frontend: str = "logmel"  # logmel | pcen (mel energies through a trainable PCEN,
    # dlr_runtime/pcen.py) | logmel_pcen (both side by side) | raw (the paper's raw samples)
    # | speech_embedding (frozen, learnt from recorded speech: dlr_runtime/speech_embedding.py;
    # it sets 80 ms frames, 0.78 s windows and no VTLP, `embedding_options`)
    pcen_fixed: bool = False  # pcen, logmel_pcen: keep alpha, delta and r at the paper's values
    n_mels: int = 40  # the mel front ends: mel bands
    frame_stride: int = 320  # samples per frame (320 = 20 ms)
    frame_window: int = 0  # samples the front end sees per frame (0: the frame alone; 640:
    # 40 ms Hann windows overlapping by half, dlr_runtime/frontend.py)
    pool_window_s: float = 0.3  # head window time constant (s); 0 = running mean
    feature_norm_s: float = 0.0  # causal mean subtraction from the front-end features, time
    # constant (s); 0 = off (dlr_runtime/feature_norm.py)
    window_s: float = 2.4  # training window length
    onset_max_s: float = 0.9  # latest start of a window's first word (s; from -0.2)
    epoch_windows: int = 19200  # training windows per epoch
    valid_clips: int = 1200  # valid clips scored per evaluation (0: all)
    valid_silence: int = 200  # word-less valid windows per evaluation
    valid_context_s: float = 60.0  # valid clips are also scored after this much of a valid
    # stream (context_* metrics: long-context state, as in a live stream); 0 = off
    vtlp: bool = True  # warp the mel filterbank per training window
    label_smoothing: float = 0.05  # cross-entropy label smoothing
    peak_loss_weight: float = 0.0  # adds this times -log(peak smoothed posterior) of each word
    # (training/peak_loss.py); 0 = per-frame cross-entropy alone
    false_peak_loss_weight: float = 0.0  # adds this times -log(1 - peak smoothed command
    # posterior) over each silence / unknown-word run (training/peak_loss.py); 0 = off
    peak_smooth_frames: int = 15  # the peak loss's smoothing window in frames (the detector's)
    tiny_corpus: bool = False  # a few voices and words only (tests and smoke runs)
    codecs: bool = False  # training words also through MP3 / Opus (ffmpeg; data/codecs.py)
    morphs: int = 0  # WORLD morphs (new pitch and vocal tract) per non-espeak training voice
    p_espeak: float = 0.4  # share of espeak-ng words among the unmorphed ones (data/sc12.py)
    p_morph: float = 0.25  # share of morphed voices' words, with --morphs
    balance_engines: bool = False  # draw a word's engine uniformly, then one of its clips
    p_command: float = 0.55  # a window's word is a command with this probability, else an unknown
    # word (data/sc12.py WindowConfig.p_command); word-less windows stay at their 15 %
    p_near_miss: float = 0.0  # share of unknown words drawn from the near misses of a command
    # (data/vocab.py NEAR_MISSES, and with extra_near_misses those too); 0: every unknown word
    # alike
    p_pair: float = 0.0  # share of word windows that are a minimal pair: a command and one of its
    # near misses from the same voice, under the same effects (data/sc12.py); 0: none
    pair_loss_weight: float = 0.0  # adds this times the pair windows' margin loss on the
    # command's log-odds against _unknown_ (training/pair_loss.py); 0 = off
    pair_margin: float = 6.0  # that loss's wanted gap in log-odds (nats)
    extra_near_misses: bool = False  # the training voices also say the dictionary's near misses
    # of the commands (data/near_misses.py; about 220 words, never in valid or test), a layer
    # cached apart from the corpus (corpus.near_miss_layer)
    speed_prob: float = RoomConfig.speed_prob  # share of training words whose speed is changed
    # by resampling (0.85-1.15: pitch and formants move with it; data/rooms.py)
    snr_min_db: float = 0.0  # low end (dB) of the windows' speech-to-background ratio (to 30)
    # (data/rooms.py RoomConfig.snr_db)
    reverb_prob: float = RoomConfig.reverb_prob  # share of training words in a simulated room
    # (an impulse response of data/rooms.py's bank)
    clip_prob: float = RoomConfig.clip_prob  # share of word windows clipped by 0-10 dB
    # (data/rooms.py)
    kokoro_extra: bool = False  # eight more Kokoro mixes of the training speakers (train only)
    kokoro_accents: bool = False  # Kokoro training speakers reading other accents (train only)
    more_engines: bool = False  # also MBROLA, RHVoice and SVOX Pico (data/engines.py
    # MORE_ENGINES; Debian contrib / non-free), in every split of the preset
    rhvoice_accents: bool = False  # with more_engines, RHVoice's voices of other languages
    # (data/engines.py RHVOICE_ACCENTED): ten train, the others are test voices (licences)
    pico_accents: bool = False  # with more_engines, Pico's German, Spanish, French and Italian
    # voices reading English (data/engines.py PICO_ACCENTED): four women, all train
    mbrola_accents: bool = False  # with more_engines, 28 more MBROLA speakers reading respelled
    # English in their own language (data/engines.py MBROLA_ACCENTED), all train
    freq_masks: int = 0  # SpecAugment (training/spec_augment.py): mel-band spans masked per window
    freq_mask_width: int = 7  # each spans fewer than this many bands
    time_masks: int = 0  # SpecAugment: frame spans masked per window
    time_mask_width: int = 5  # each spans fewer than this many frames
    invariance_weight: float = 0.0  # adds this times the share of the scored features'
    # variance between the words' engines (training/invariance.py); 0 = off
    invariance_classwise: bool = False  # compare the engines within each word label
    phoneme_loss_weight: float = 0.0  # adds this times the CTC loss of a training-only head that
    # spells the window's words in phonemes (training/phoneme_loss.py); 0 = off
    phoneme_loss_block: int = 0  # the block whose output the phoneme head reads (1 = the first;
    # 0 = the last, the features the classifier pools)
    select: str = "accuracy"  # the valid metric that keeps model/: accuracy | command_accuracy
    unknown_classes: bool = False  # the head scores each unknown word of the corpus (and of
    # --extra-near-misses) as its own class and `_unknown_` as their union
    # (dlr_runtime/unknown_head.py); the cross-entropy is over those classes


def corpus_config(opts: KWSOptions, seed: int) -> CorpusConfig:
    """The corpus of a run: the full one, or a tiny one for tests."""
    if not opts.tiny_corpus:
        return CorpusConfig(
            seed=seed,
            kokoro_extra=opts.kokoro_extra,
            kokoro_accents=opts.kokoro_accents,
            rhvoice_accents=opts.rhvoice_accents,
            pico_accents=opts.pico_accents,
            mbrola_accents=opts.mbrola_accents,
            engines=engines_for(opts.more_engines),
        )
    return CorpusConfig(
        seed=seed,
        accents=("en-us",),
        variants=("m1", "m2", "m3", "f1", "f2", "f3", "klatt", "klatt2"),
        engines=("espeak", "flite"),
        espeak_command_renditions=1,
        espeak_unknown_per_voice=6,
        command_renditions=2,
        unknown_renditions=1,
        unknown=unknown_words()[:24],
    )


def load_split(opts: KWSOptions, seed: int) -> dict[str, WordPool]:
    """Generate/load the corpus and return one WordPool per split of ``opts.split``."""
    ccfg = corpus_config(opts, seed)
    voices = all_tts_voices(ccfg)
    split = split_voices(voices, opts.split, seed)
    check_disjoint(split)
    keep = [v for vs in split.values() for v in vs]
    clips = generate(ccfg, opts.cache_dir, opts.workers, voices=keep)
    pools = {}
    for name, vs in split.items():
        clean = [clips[v.key] for v in vs]
        if name == "train" and opts.morphs:
            sources = [vc for vc in clean if vc.voice.engine != "espeak"]
            clean += morph.morphed_voices(opts.cache_dir, ccfg, sources, opts.morphs, opts.workers)
        coded = None
        if name == "train" and opts.codecs:
            if not codecs.available():
                raise RuntimeError("--codecs needs ffmpeg (scripts/setup.sh installs it)")
            coded = [codecs.coded_voice(opts.cache_dir, ccfg, vc) for vc in tqdm(clean, "codecs")]
        if name == "train" and opts.extra_near_misses:
            xcfg = near_miss_layer(ccfg, extra_words()[: 24 if opts.tiny_corpus else None])
            extra = generate(xcfg, opts.cache_dir, opts.workers, voices=vs)
            clean += [extra[v.key] for v in vs]
            if coded is not None:
                coded += [codecs.coded_voice(opts.cache_dir, xcfg, extra[v.key]) for v in vs]
        pools[name] = WordPool.from_voices(clean, coded)
    return pools


def unknown_vocab(opts: KWSOptions, seed: int) -> tuple[str, ...]:
    """The unknown words of a run's training voices, in a fixed order: the corpus's, then
    --extra-near-misses' (the classes of --unknown-classes)."""
    words = tuple(corpus_config(opts, seed).unknown)
    if opts.extra_near_misses:
        words += tuple(extra_words()[: 24 if opts.tiny_corpus else None])
    return words


#: Share of training windows with a word (data/sc12.py): ``--p-command`` moves words between
#: commands and unknown words, not between words and word-less windows.
WORDS_SHARE = WindowConfig.p_command + WindowConfig.p_unknown


def embedding_options(opts: KWSOptions) -> KWSOptions:
    """`opts` for the speech-embedding front end, which fixes the framing (80 ms frames, each
    seen through its 0.78 s window) and has no mel filterbank of ours to warp (VTLP off)."""
    if (opts.frame_stride, opts.frame_window) not in ((320, 0), (EMBED_STRIDE, EMBED_WINDOW)):
        raise ValueError(
            f"--frontend speech_embedding sets --frame-stride {EMBED_STRIDE} and --frame-window "
            f"{EMBED_WINDOW}; got {opts.frame_stride} and {opts.frame_window}"
        )
    return replace(opts, frame_stride=EMBED_STRIDE, frame_window=EMBED_WINDOW, vtlp=False)


def window_config(opts: KWSOptions) -> WindowConfig:
    """The training windows of a run (data/sc12.py), from its options."""
    return WindowConfig(
        window_s=opts.window_s,
        onset_max_s=opts.onset_max_s,
        stride=opts.frame_stride,
        p_espeak=opts.p_espeak,
        p_morph=opts.p_morph,
        balance_engines=opts.balance_engines,
        p_command=opts.p_command,
        p_unknown=round(WORDS_SHARE - opts.p_command, 9),  # (word-less windows unchanged)
        p_near_miss=opts.p_near_miss,
        p_pair=opts.p_pair,
        room=RoomConfig(
            snr_db=(opts.snr_min_db, RoomConfig().snr_db[1]),
            speed_prob=opts.speed_prob,
            reverb_prob=opts.reverb_prob,
            clip_prob=opts.clip_prob,
        ),
    )


class WarpedFrontend:
    """Mel filterbanks with the frequency axis scaled by a factor (VTLP), cached per 1 %."""

    def __init__(self, fe: LogMel) -> None:
        self.fe = fe
        self.cache: dict[int, torch.Tensor] = {}

    def bank(self, warp: float) -> torch.Tensor:
        key = int(round(warp * 100))
        if key not in self.cache:
            fb = mel_filterbank(self.fe.bin_hz * (key / 100), self.fe.n_mels, self.fe.f_max)
            self.cache[key] = fb.float()
        return self.cache[key]

    def features(self, frames: torch.Tensor, warps: torch.Tensor) -> torch.Tensor:
        """Frame windows (B, F, W), warps (B,) -> the front end's mel features (B, F, M)."""
        banks = torch.stack([self.bank(float(w)) for w in warps]).to(frames)  # (B, K, M)
        return self.fe.compress(torch.bmm(self.fe.power(frames), banks))


def block_outputs(model: DLRModel, feats: torch.Tensor) -> list[torch.Tensor]:
    """Front-end features (B, F, D) -> every block's output [(B, F, H)], first to last."""
    h = model.encoder.embed_features(feats)  # (B, F, H)
    outs = []
    for block in model.blocks:
        h = block(h)
        outs.append(h)
    return outs


def block_features(model: DLRModel, feats: torch.Tensor) -> torch.Tensor:
    """Front-end features (B, F, D) -> the last block's output (B, F, H), before the head."""
    return block_outputs(model, feats)[-1]


def scored_features(model: DLRModel, feats: torch.Tensor) -> torch.Tensor:
    """Front-end features (B, F, D) -> what the classifier scores (B, F, H) (the rest of
    DLRModel.forward before the head's projection)."""
    return model.head.scored_features(block_features(model, feats))


def frame_logits(model: DLRModel, feats: torch.Tensor) -> torch.Tensor:
    """Front-end features (B, F, D) -> class scores (B, F, C) (the rest of DLRModel.forward)."""
    return model.head.proj(scored_features(model, feats))


@torch.no_grad()
def last_frame_scores(model: nn.Module, audio: torch.Tensor, batch: int = 64) -> torch.Tensor:
    """Scores after the last frame of each window (N, C), offline."""
    outs = []
    for s in range(0, len(audio), batch):
        outs.append(model(audio[s : s + batch])[:, -1].float())
    return torch.cat(outs) if outs else torch.zeros(0, len(SC12_LABELS))


def clip_metrics(scores: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """Accuracy, command accuracy, false accepts and loss of last-frame scores (N, C)."""
    pred = scores.argmax(-1)
    is_cmd = labels < SIL
    rejected_ok = pred[~is_cmd] >= SIL
    return {
        "accuracy": float((pred == labels).float().mean()),
        "command_accuracy": float((pred[is_cmd] == labels[is_cmd]).float().mean()),
        "false_accept": float(1 - rejected_ok.float().mean()),
        "loss": float(F.cross_entropy(scores, labels)),
        "clips": float(len(labels)),
    }


class KWSRecipe(Recipe):
    name = "kws"
    primary = "accuracy"
    plotted = ("context_accuracy",)  # the valid clips after a stream's worth of state
    higher_is_better = True
    items_name = "windows"

    def __init__(self, opts: KWSOptions, model_opts: ModelOptions, train: TrainConfig) -> None:
        if opts.frontend == "speech_embedding":
            opts = embedding_options(opts)
        if opts.frontend not in FRONTENDS:
            raise ValueError(
                f"--frontend must be one of {', '.join(FRONTENDS)}, got {opts.frontend!r}"
            )
        if opts.pcen_fixed and opts.frontend not in PCEN_FRONTENDS:
            raise ValueError("--pcen-fixed needs --frontend pcen or logmel_pcen")
        if SAMPLE_RATE % opts.frame_stride and opts.frontend != "speech_embedding":
            raise ValueError(f"--frame-stride must divide {SAMPLE_RATE}, got {opts.frame_stride}")
        if opts.frame_window and opts.frame_window < opts.frame_stride:
            raise ValueError(
                f"--frame-window must be 0 or >= --frame-stride ({opts.frame_stride}), "
                f"got {opts.frame_window}"
            )
        if opts.morphs < 0:
            raise ValueError(f"--morphs must be >= 0, got {opts.morphs}")
        if opts.select not in SELECT_METRICS:
            raise ValueError(
                f"--select must be one of {', '.join(SELECT_METRICS)}, got {opts.select!r}"
            )
        self.primary = opts.select  # (the class's default: accuracy)
        if not -0.2 < opts.onset_max_s < opts.window_s:
            raise ValueError(
                f"--onset-max-s must be in (-0.2, --window-s {opts.window_s:g}), "
                f"got {opts.onset_max_s}"
            )
        snr_max = RoomConfig().snr_db[1]
        if not opts.snr_min_db < snr_max:
            raise ValueError(f"--snr-min-db must be below {snr_max:g}, got {opts.snr_min_db}")
        for flag, p in (
            ("--p-espeak", opts.p_espeak),
            ("--p-morph", opts.p_morph),
            ("--p-near-miss", opts.p_near_miss),
            ("--p-command", opts.p_command),
            ("--p-pair", opts.p_pair),
            ("--speed-prob", opts.speed_prob),
            ("--reverb-prob", opts.reverb_prob),
            ("--clip-prob", opts.clip_prob),
        ):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{flag} must be in [0, 1], got {p}")
        if opts.p_command > WORDS_SHARE:
            raise ValueError(
                f"--p-command must be at most {WORDS_SHARE:g} (the share of windows with a "
                f"word), got {opts.p_command}"
            )
        self.specaug = SpecAugmentConfig(
            freq_masks=opts.freq_masks,
            freq_mask_width=opts.freq_mask_width,
            time_masks=opts.time_masks,
            time_mask_width=opts.time_mask_width,
        )
        self.specaug.check(opts.n_mels)
        self.peak = PeakLossConfig(
            weight=opts.peak_loss_weight,
            false_weight=opts.false_peak_loss_weight,
            smooth_frames=opts.peak_smooth_frames,
        )
        self.peak.check()
        self.pair = PairLossConfig(weight=opts.pair_loss_weight, margin=opts.pair_margin)
        self.pair.check()
        if self.pair.active and opts.p_pair <= 0:
            raise ValueError("--pair-loss-weight needs pair windows (--p-pair > 0)")
        self.invariance = InvarianceConfig(
            weight=opts.invariance_weight,
            classwise=opts.invariance_classwise,
        )
        self.invariance.check()
        self.phoneme = PhonemeLossConfig(weight=opts.phoneme_loss_weight)
        self.phoneme.check()
        if self.phoneme.active and opts.extra_near_misses:
            raise ValueError(
                "--phoneme-loss-weight needs every training word in the phoneme table "
                "(data/phonemes_en_us.json); the words of --extra-near-misses are not in it"
            )
        if not 0 <= opts.phoneme_loss_block <= model_opts.n_layers:
            raise ValueError(
                f"--phoneme-loss-block must be in [0, --n-layers {model_opts.n_layers}], "
                f"got {opts.phoneme_loss_block}"
            )
        self.phoneme_table: PhonemeTable | None = load_table() if self.phoneme.active else None
        self.phoneme_head: PhonemeHead | None = None  # built by auxiliary()
        # running sums of batch metrics since the last evaluation: name -> (sum, batches)
        self._running: dict[str, np.ndarray] = {}
        self._running_last: dict[str, float] = {}
        self.word_labels = torch.tensor([*range(SIL), UNK])  # commands and _unknown_
        self.reject_labels = torch.tensor([SIL, UNK])
        self.command_labels = torch.arange(SIL)
        if self.specaug.active and opts.frontend != "logmel":
            raise ValueError("--freq-masks / --time-masks need --frontend logmel")
        self.opts, self.model_opts = opts, model_opts
        self.batch_size, self.seed = train.batch_size, train.seed
        self.num_workers = train.num_workers
        self.warp: WarpedFrontend | None = None
        # the head's unknown classes (--unknown-classes); empty: one _unknown_ class
        self.unknown_vocab = unknown_vocab(opts, train.seed) if opts.unknown_classes else ()

    def describe(self) -> dict[str, Any]:
        return {"kws": asdict(self.opts), "model": self.model_opts.to_dict()}

    def setup(self, ctx: DistContext) -> None:
        o = self.opts
        self.pools = load_split(o, self.seed)
        self.rirs = rir_bank(o.cache_dir, seed=self.seed)
        self.train_set = KWSWindows(
            self.pools["train"],
            self.rirs,
            window_config(o),
            self.seed,
            o.epoch_windows,
            phonemes=self.phoneme_table,
            unknown_vocab=self.unknown_vocab or None,
        )
        self.sampler = ShardedSampler(len(self.train_set), self.seed, ctx.rank, ctx.world_size)
        valid = self.pools["valid"]
        rng = np.random.default_rng([self.seed, 0xFA1])
        idx = np.arange(len(valid))
        if o.valid_clips and len(idx) > o.valid_clips:
            idx = np.sort(rng.choice(idx, o.valid_clips, replace=False))
        audio = clip_windows(valid, idx, self.rirs, self.seed, augment=True)
        sil = silence_windows(o.valid_silence, valid, self.seed)
        self.valid_audio = torch.cat([audio, sil])
        self.valid_labels = torch.cat(
            [torch.from_numpy(valid.labels[idx]), torch.full((len(sil),), SIL)]
        )
        self.valid_context: torch.Tensor | None = None
        if o.valid_context_s > 0:
            audio = build_stream(valid, o.valid_context_s / 60, self.rirs, self.seed).audio
            keep = len(audio) // o.frame_stride * o.frame_stride  # whole frames
            self.valid_context = torch.from_numpy(audio[:keep])

    def build_model(self) -> nn.Module:
        o = self.opts
        cfg = self.model_opts.to_config(
            encoder="audio",
            decoder="classifier",
            labels=list(SC12_LABELS),
            sample_rate=SAMPLE_RATE,
            frame_stride=o.frame_stride,
            frame_window=o.frame_window,
            frontend=o.frontend,
            n_mels=o.n_mels,
            pool_window_s=o.pool_window_s,
            feature_norm_s=o.feature_norm_s,
            unknown_classes=len(self.unknown_vocab),
        )
        model = DLRModel(cfg, seed=self.seed)
        if o.pcen_fixed:  # out of the optimiser (optim.param_groups), so also of weight decay
            model.encoder.pcen.requires_grad_(False)
        if o.frontend != "raw" and o.vtlp:
            self.warp = WarpedFrontend(model.encoder.frontend)
        return model

    def auxiliary(self) -> nn.Module | None:
        """The phoneme loss's head (training only), when the loss is on."""
        if self.phoneme_table is None:
            return None
        with torch.random.fork_rng():  # the model's initialisation stays as without the head
            torch.manual_seed(self.seed + 0x9407)
            self.phoneme_head = PhonemeHead(self.model_opts.d_model, self.phoneme_table.n_classes)
        return self.phoneme_head

    def steps_per_epoch(self) -> int:
        return self.sampler.per_rank() // self.batch_size

    def train_batches(self, epoch: int, start: int) -> Iterator[Any]:
        self.train_set.set_epoch(epoch)
        self.sampler.set_epoch(epoch, start * self.batch_size)
        loader = DataLoader(
            self.train_set,
            batch_size=self.batch_size,
            sampler=self.sampler,
            drop_last=True,
            num_workers=self.num_workers,
        )
        return iter(loader)

    def loss(self, model: nn.Module, batch: Any, device: torch.device) -> tuple[torch.Tensor, int]:
        item = KWSItem(*batch)
        audio, targets = item.audio.to(device), item.targets.to(device)
        feats_out: torch.Tensor | None = None  # what the classifier scores (B, F, H)
        spelled: torch.Tensor | None = None  # the output the phoneme head reads (B, F, H)
        explicit = self.warp is not None or self.specaug.active or self.invariance.active
        explicit = explicit or bool(self.unknown_vocab)
        if explicit or self.phoneme_head is not None:
            cfg = model.config
            frames = frames_of(audio, cfg.frame_stride, cfg.history)  # (B, F, W)
            if self.warp is not None:
                feats = self.warp.features(frames, item.warp)  # (B, F, M)
            else:
                feats = model.encoder.frontend(frames)
            outs = block_outputs(model, spec_augment(feats, self.specaug))  # [(B, F, H)]
            feats_out = model.head.scored_features(outs[-1])  # (B, F, H)
            spelled = outs[self.opts.phoneme_loss_block - 1]  # (block 0: the last)
            logits = model.head.proj(feats_out)  # (B, F, C)
        else:
            logits = model(audio)  # (B, F, C)
        n = min(logits.shape[1], targets.shape[1])
        scored, wanted = logits, targets  # what the cross-entropy compares
        if self.unknown_vocab and feats_out is not None:  # every unknown word its own class
            scored = model.head.proj.fine(feats_out)  # (B, F, C - 1 + K)
            wanted = item.classes.to(device)
        loss = F.cross_entropy(
            scored[:, :n].reshape(-1, scored.shape[-1]).float(),
            wanted[:, :n].reshape(-1),
            ignore_index=IGNORE,
            label_smoothing=self.opts.label_smoothing,
        )
        if self.peak.active:
            sm = smoothed_softmax(logits[:, :n], self.peak.smooth_frames)  # (B, n, C)
            t = targets[:, :n]
            if self.peak.weight > 0:
                loss = loss + self.peak.weight * peak_span_loss(sm, t, self.word_labels)
            if self.peak.false_weight > 0:
                false = false_peak_loss(sm, t, self.reject_labels, self.command_labels)
                loss = loss + self.peak.false_weight * false
        if self.opts.p_pair > 0:  # pair windows: their gap measured, the loss added if asked
            pair_cmd, t = item.pair_cmd.to(device), targets[:, :n]
            with torch.set_grad_enabled(self.pair.active and torch.is_grad_enabled()):
                gaps = pair_gaps(logits[:, :n].float(), t, pair_cmd, UNK)  # (P,)
            if self.pair.active:
                loss = loss + self.pair.weight * margin_loss(gaps, self.pair.margin)
            if gaps.numel():
                self._accumulate("pair_gap", gaps.detach().mean())
        if feats_out is not None:  # measured in every run that has the features, added if asked
            domains = item.domains.to(device)[:, :n]  # (B, n)
            groups = item.words.to(device)[:, :n] if self.invariance.classwise else None
            if self.invariance.active:
                share = domain_share(feats_out[:, :n].float(), domains, groups)
                loss = loss + self.invariance.weight * share
            else:
                with torch.no_grad():
                    share = domain_share(feats_out[:, :n].float(), domains, groups)
            self._accumulate("domain_share", share)
        if self.phoneme_head is not None and spelled is not None:
            log_probs = self.phoneme_head(spelled)  # (B, F, P + 1)
            phones, n_phones = item.phones.to(device), item.n_phones.to(device)
            ctc = phoneme_ctc_loss(log_probs, phones, n_phones)
            loss = loss + self.phoneme.weight * ctc
            self._accumulate("phoneme_loss", ctc)
        return loss, audio.shape[0]

    def _accumulate(self, name: str, value: torch.Tensor) -> None:
        self._running.setdefault(name, np.zeros(2))
        self._running[name] += (float(value.detach()), 1.0)

    def training_metrics(self) -> dict[str, float]:
        """The mean domain share and phoneme loss of the training batches since the last call
        (the last values again when no batch came since; nothing the loss never computed)."""
        for name, (total, n) in self._running.items():
            if n:
                self._running_last[name] = total / n
        self._running = {}
        return dict(self._running_last)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, device: torch.device, split: str = "valid") -> dict:
        was = model.training
        model.eval()
        scores = last_frame_scores(model, self.valid_audio.to(device)).cpu()
        out = clip_metrics(scores, self.valid_labels)
        if self.valid_context is not None:
            after = scores_after_context(model, self.valid_context, self.valid_audio)
            ctx = clip_metrics(after, self.valid_labels)
            out.update({f"context_{k}": v for k, v in ctx.items() if k != "clips"})
        out.update(self.training_metrics())
        model.train(was)
        return out

    @torch.no_grad()
    def stream_check(self, model: nn.Module, dtype: torch.dtype) -> dict:
        """The recurrent form fed 100 ms chunks vs the offline forward on valid clips."""
        model = model.cpu().eval()
        rec = to_recurrent(model, dtype=dtype)
        audio = self.valid_audio[:64]
        offline = model(audio)  # (n, F, C)
        state = rec.init_state(len(audio))
        outs = []
        for s in range(0, audio.shape[1], SAMPLE_RATE // 10):
            y, state = rec.chunk(audio[:, s : s + SAMPLE_RATE // 10].to(rec.rdtype), state)
            outs.append(y)
        stream = torch.cat(outs, dim=1).to(offline.dtype)
        return {
            "state_dtype": str(dtype).removeprefix("torch."),
            "max_abs_score_diff": float((stream - offline).abs().max()),
            "final_prediction_agreement": float(
                (stream[:, -1].argmax(-1) == offline[:, -1].argmax(-1)).float().mean()
            ),
        }

    def finish(self, model: nn.Module, device: torch.device, out_dir: Path) -> dict[str, Any]:
        results: dict[str, Any] = {"valid": self.evaluate(model, device)}
        results["streaming"] = {
            "complex64": self.stream_check(model, torch.complex64),
            "complex128": self.stream_check(model, torch.complex128),
        }
        results["state_bytes_per_session"] = to_recurrent(model.cpu()).state_bytes_per_session()
        results["split"] = {k: sorted(set(p.voices.tolist())) for k, p in self.pools.items()}
        last = self.training_metrics()
        if "domain_share" in last:
            results["invariance"] = {
                **asdict(self.invariance),
                "domains": self.train_set.domain_names,
                "domain_share": last["domain_share"],
            }
        if "phoneme_loss" in last and self.phoneme_table is not None:
            results["phoneme_loss"] = {
                **asdict(self.phoneme),
                "block": self.opts.phoneme_loss_block or self.model_opts.n_layers,
                "phonemes": len(self.phoneme_table.inventory),
                "final": last["phoneme_loss"],
            }
        if "pair_gap" in last:
            results["pairs"] = {
                "p_pair": self.opts.p_pair,
                **asdict(self.pair),
                "gap": last["pair_gap"],
            }
        if self.unknown_vocab:
            results["unknown_classes"] = list(self.unknown_vocab)
        results["sizes"] = {
            k: {
                "clips": len(p),
                "commands": int((p.labels < SIL).sum()),
                "unknown": int((p.labels == UNK).sum()),
            }
            for k, p in self.pools.items()
        }
        model.to(device)
        return results

    def save_model(self, model: nn.Module, path: Path, summary: dict[str, Any]) -> None:
        save_checkpoint(model, path, training=summary, task=TASK, detection=asdict(KWSConfig()))
