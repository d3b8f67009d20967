"""SC12 keyword-spotting data for streaming models: windows with per-frame targets, eval clips.

Training items (:class:`KWSWindows`) are 2.4 s windows assembled on the fly from the clean
corpus (``corpus.py``) of one split's voices: 0, 1 or 2 words at random places over a
background (``rooms.py``), and one target per frame of ``stride`` samples:

    before a word ........ ``_silence_``
    inside the word ...... ignored (-100): the word is not decided until it ends
    end .. end + hold .... the word's label (a command or ``_unknown_``)
    then 0.3 s ........... ignored (the exponential head forgets gradually)
    afterwards ........... ``_silence_``

so a causal model learns to say a word shortly after it ends and to fall back to
``_silence_``; an item (:class:`KWSItem`) also carries a VTLP warp factor for the recurrent
front end and, for the domain-invariance penalty (``training/invariance.py``), each frame's
*domain*: the index of the word's engine (``KWSWindows.domain_names``) from the word's start to
the end of its hold, ``IGNORE`` elsewhere, and the word's label over the same span (a morph or
codec copy counts as its source voice's engine), and, given a phoneme table
(``phonemes.py``), the phonemes of its words for the auxiliary phoneme loss
(``training/phoneme_loss.py``; -1 phonemes when a word is cut by the window's edge). None of
these draws from the window's random stream.
85 % of the windows hold words, 15 % none; each word is a command with probability
``p_command`` (55 %), else an unknown word. The engine group
(espeak-ng vs the other engines) is drawn 40/60, so the few non-espeak speakers are not drowned
out; where the pool holds morphed voices (``morph.py``), a word comes from them with
probability ``p_morph`` first. Inside a group a clip is drawn uniformly, so an engine weighs
as much as its clips; ``balance_engines`` draws the engine first (festival's ten training
voices then weigh as much as flite's three). With ``p_near_miss``, that share of the unknown
words is drawn among the near misses of a command (``vocab.NEAR_MISSES``: "goat", "yet",
"dawn", ...; with the dictionary layer of ``near_misses.py`` those words too), the words a
keyword spotter most often fires on; by default every unknown word is alike, and near misses
are about a fifth of them. With ``p_pair``, that share of the word windows is a *minimal pair*
instead: a command and one of its near misses (``vocab.NEAR_MISSES_OF``, and the dictionary's
``near_misses.extra_near_misses`` where the pool has those words), said by the same voice, in
random order, under one speed change and reverb (one seed for both words' effects) and one
channel, background and level (the window's), so that only the words differ; the item names
the pair's command (``KWSItem.pair_cmd``) for the pair loss (``training/pair_loss.py``).

Evaluation clips (:func:`clip_windows`) are 1.5 s windows whose word ends 0.15-0.45 s before
the end (the last frame's scores are the clip's prediction, as in the server's utterance mode),
clean (faint noise floor) or with the training augmentation, deterministic from a seed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch
from torch.utils.data import Dataset

from training.data.corpus import VoiceClips
from training.data.labels import SAMPLE_RATE, SC10_LABELS
from training.data.near_misses import extra_near_misses, extra_words
from training.data.phonemes import PhonemeTable
from training.data.rooms import RoomConfig, background, channel, level, word_effects
from training.data.vocab import NEAR_MISSES, NEAR_MISSES_OF, SC12_LABELS, SILENCE, UNKNOWN

IGNORE = -100
MAX_PHONES = 32  # room for the phonemes of a window's words (two words: at most ~20)
SIL = SC12_LABELS.index(SILENCE)
UNK = SC12_LABELS.index(UNKNOWN)
#: The words ``p_near_miss`` draws among: vocab's near misses, and the dictionary's of
#: ``near_misses.py`` where a run's pool has them (``--extra-near-misses``).
NEAR_MISS_WORDS: tuple[str, ...] = (*NEAR_MISSES, *extra_words())
N_COMMANDS = len(SC10_LABELS)


def near_miss_commands() -> dict[str, tuple[int, ...]]:
    """Each near-miss word -> the labels of the commands it is one sound away from (vocab's
    hand-picked words and the dictionary's, ``near_misses.py``)."""
    out: dict[str, list[int]] = {}
    for table in (NEAR_MISSES_OF, extra_near_misses()):
        for command, words in table.items():
            lab = SC12_LABELS.index(command)
            for w in words:
                labs = out.setdefault(w, [])
                if lab not in labs:
                    labs.append(lab)
    return {w: tuple(labs) for w, labs in out.items()}


@dataclass(frozen=True)
class WindowConfig:
    """Shape of the training windows and their targets."""

    window_s: float = 2.4  # length of a training window
    onset_max_s: float = 0.9  # the first word starts between -0.2 s and this (the window's
    # state starts at zero, so later onsets show the model words after longer context)
    stride: int = 320  # samples per model frame (targets are per frame)
    hold_s: float = 0.5  # the label holds this long after the word ends
    settle_s: float = 0.04  # ignored right after the end (reverb tail, frame rounding)
    fade_s: float = 0.3  # ignored after the hold
    p_command: float = 0.55  # event mix of a window
    p_unknown: float = 0.30
    p_two_words: float = 0.3  # a second word after the first
    p_espeak: float = 0.4  # share of espeak-ng clips among the words
    p_morph: float = 0.25  # share of morphed voices' clips (data/morph.py), where the pool has them
    balance_engines: bool = False  # inside a group, draw the engine first (uniformly), then a
    # clip of it; False: a clip of the group (engines weighted by their clip counts)
    p_near_miss: float = 0.0  # an unknown word is drawn among the near misses of a command
    # (vocab.NEAR_MISSES) with this probability; 0: among every unknown word, no extra draw
    p_pair: float = 0.0  # a word window is a minimal pair (a command and its near miss, one
    # voice) with this probability; 0: never, no extra draw
    pair_onset_s: tuple[float, float] = (0.0, 0.4)  # a pair's first word starts in this span
    # (early, so that the second word and its hold fit in the window)
    vtlp_prob: float = 0.8  # warp the front end's frequency axis
    vtlp: tuple[float, float] = (0.85, 1.18)
    room: RoomConfig = field(default_factory=RoomConfig)


@dataclass
class WordPool:
    """The clean clips of a set of voices, with who said what."""

    clips: list[np.ndarray]  # int16 views, 16 kHz
    labels: np.ndarray  # int64 (N,), SC12 index
    words: np.ndarray  # str (N,)
    voices: np.ndarray  # str (N,), voice key "engine:name"
    engines: np.ndarray  # str (N,)
    speakers: np.ndarray  # str (N,)
    morphed: np.ndarray  # bool (N,): from a morph of a voice (data/morph.py)
    coded: list[np.ndarray] | None = None  # the same clips after a lossy codec (codecs.py)

    @classmethod
    def from_voices(
        cls, voices: Sequence[VoiceClips], coded: Sequence[VoiceClips] | None = None
    ) -> WordPool:
        """The clips of `voices`; `coded`: the same voices through their codecs, in order."""
        clips, labels, words, keys, engines, speakers, morphed = [], [], [], [], [], [], []
        if coded is not None and [c.voice.key for c in coded] != [v.voice.key for v in voices]:
            raise ValueError("coded voices must match the voices, in order")
        coded_clips: list[np.ndarray] | None = [] if coded is not None else None
        for k, vc in enumerate(voices):
            for i in range(len(vc)):
                clips.append(vc.audio[vc.offsets[i] : vc.offsets[i + 1]])
                if coded_clips is not None and coded is not None:
                    cv = coded[k]
                    coded_clips.append(cv.audio[cv.offsets[i] : cv.offsets[i + 1]])
            n = len(vc)
            labels.append(vc.labels)
            words.append(vc.words)
            keys += [vc.voice.key] * n
            engines += [vc.voice.engine] * n
            speakers += [vc.voice.speaker] * n
            morphed += [bool(vc.voice.morph)] * n
        return cls(
            clips,
            np.concatenate(labels) if labels else np.zeros(0, np.int64),
            np.concatenate(words) if words else np.zeros(0, str),
            np.array(keys, dtype=str),
            np.array(engines, dtype=str),
            np.array(speakers, dtype=str),
            np.array(morphed, dtype=bool),
            coded_clips,
        )

    def __len__(self) -> int:
        return len(self.labels)

    def audio(self, i: int, coded: bool = False) -> np.ndarray:
        """Clip `i` as float32; `coded`: its lossy-codec copy (needs `self.coded`)."""
        src = self.coded if coded and self.coded is not None else self.clips
        return src[i].astype(np.float32) / 32767.0


def _place(x: np.ndarray, word: np.ndarray, onset: int) -> None:
    """Add ``word`` into ``x`` starting at ``onset`` (cropped at either end)."""
    s, e = max(0, onset), min(len(x), onset + len(word))
    if e > s:
        x[s:e] += word[s - onset : e - onset]


def _mix(
    x: np.ndarray, speech_power: float, rng: np.random.Generator, cfg: RoomConfig, babble
) -> np.ndarray:
    """Add a background at a random SNR (or, with no speech, at a random absolute level)."""
    bg = background(len(x), rng, babble)
    if speech_power > 0:
        snr = float(rng.uniform(*cfg.snr_db))
        return x + bg * np.float32(np.sqrt(speech_power / 10 ** (snr / 10)))
    return x + bg * np.float32(10 ** (float(rng.uniform(*cfg.silence_dbfs)) / 20))


class KWSItem(NamedTuple):
    """One training window (batched by the DataLoader into the same fields, with a batch axis)."""

    audio: torch.Tensor  # (L,) float32
    targets: torch.Tensor  # (L // stride,) int64: SC12 label or IGNORE
    warp: float  # VTLP factor of the front end's frequency axis (1.0: none)
    # (L // stride,) int64: the word's engine (an index into KWSWindows.domain_names) or IGNORE
    domains: torch.Tensor
    words: torch.Tensor  # (L // stride,) int64: the label of the word of a frame with a domain
    # (its whole span, where `targets` ignores its start), IGNORE elsewhere
    phones: torch.Tensor  # (MAX_PHONES,) int64: the phoneme ids of the window's words in order
    # (data/phonemes.py), padded with 0; all 0 when the dataset has no phoneme table
    n_phones: int  # how many of `phones` are the target; -1: no usable target (a word cut by
    # the window's edge, or no phoneme table)
    pair_cmd: int  # a minimal-pair window's command label (its near miss is the `_unknown_`
    # word); -1: not a pair window
    classes: torch.Tensor  # (L // stride,) int64: `targets`, except that an unknown word's
    # frames hold its class among the dataset's unknown classes (UNK + its index in
    # `unknown_vocab`, for a head whose `_unknown_` is a union: dlr_runtime/unknown_head.py);
    # equal to `targets` when the dataset has no unknown vocabulary


class KWSWindows(Dataset):
    """Training windows (:class:`KWSItem`) of one split."""

    def __init__(
        self,
        pool: WordPool,
        rirs: list[np.ndarray],
        cfg: WindowConfig = WindowConfig(),
        seed: int = 0,
        length: int = 20000,
        phonemes: PhonemeTable | None = None,
        unknown_vocab: Sequence[str] | None = None,
    ) -> None:
        self.pool, self.rirs, self.cfg, self.seed, self.length = pool, rirs, cfg, seed, length
        self.phonemes = phonemes  # phoneme targets of the auxiliary loss; None: none
        # each clip's unknown class (its word's index in unknown_vocab; -1: a command, or no
        # vocabulary), for KWSItem.classes
        self.unknown_class = np.full(len(pool), -1, np.int64)
        if unknown_vocab is not None:
            index = {w: k for k, w in enumerate(unknown_vocab)}
            unk = np.flatnonzero(pool.labels == UNK)
            missing = sorted({str(w) for w in pool.words[unk]} - set(index))
            if missing:
                raise ValueError(
                    f"unknown words not in the unknown vocabulary: {', '.join(missing[:5])}"
                    + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
                )
            self.unknown_class[unk] = [index[str(w)] for w in pool.words[unk]]
        self.epoch = 0
        esp, morph = pool.engines == "espeak", pool.morphed
        near = np.isin(pool.words, NEAR_MISS_WORDS) & (pool.labels == UNK)
        self.by_group: dict[tuple[str, int], list[np.ndarray]] = {}  # one array per engine
        # with balance_engines, else one for the group
        self.near_by_group: dict[str, list[np.ndarray]] = {}  # the same for near-miss words
        for g, mask in (("espeak", esp & ~morph), ("other", ~esp & ~morph), ("morph", morph)):
            for lab in range(len(SC12_LABELS)):
                idx = np.flatnonzero(mask & (pool.labels == lab))
                if len(idx):
                    self.by_group[(g, lab)] = self._per_engine(idx)
            idx = np.flatnonzero(mask & near)
            if len(idx):
                self.near_by_group[g] = self._per_engine(idx)
        self.groups = sorted({g for g, _ in self.by_group})
        unk = np.flatnonzero(pool.labels == UNK)
        self._babble_idx = unk if len(unk) else np.arange(len(pool))
        names, index = np.unique(pool.engines, return_inverse=True)
        self.domain_names: list[str] = [str(n) for n in names]  # sorted engines
        self.clip_domain = index.astype(np.int64)  # (N,) engine index of each clip
        # minimal pairs, by group: rows (near-miss clip, command label) whose voice also says
        # that command; and each (voice, command)'s clips
        self.pair_near: dict[str, np.ndarray] = {}
        self.voice_command: dict[tuple[str, int], np.ndarray] = {}
        if cfg.p_pair > 0:
            self._index_pairs()

    def _index_pairs(self) -> None:
        pool = self.pool
        for lab in range(N_COMMANDS):
            idx = np.flatnonzero(pool.labels == lab)
            for v in np.unique(pool.voices[idx]):
                self.voice_command[(str(v), lab)] = idx[pool.voices[idx] == v]
        commands_of = near_miss_commands()
        rows: dict[str, list[tuple[int, int]]] = {}
        for i in np.flatnonzero(pool.labels == UNK):
            voice = str(pool.voices[i])
            group = "espeak" if pool.engines[i] == "espeak" and not pool.morphed[i] else "other"
            for lab in commands_of.get(str(pool.words[i]), ()):
                if (voice, lab) in self.voice_command:
                    rows.setdefault(group, []).append((int(i), lab))
        self.pair_near = {g: np.array(r, np.int64) for g, r in sorted(rows.items())}
        if not self.pair_near:
            raise ValueError(
                "p_pair > 0 needs near misses of a command said by a voice that also says the "
                "command; this pool has none"
            )

    def _pick_pair(self, rng: np.random.Generator) -> tuple[int, int, int]:
        """A minimal pair: (command clip, near-miss clip, command label), one voice; the group
        (espeak-ng or the others, morphs among them) is drawn with p_espeak, then a near-miss
        clip uniformly (balance_engines does not apply)."""
        groups = list(self.pair_near)
        g = groups[0]
        if len(groups) == 2:
            g = "espeak" if rng.random() < self.cfg.p_espeak else "other"
        rows = self.pair_near[g]
        near, lab = (int(x) for x in rows[rng.integers(len(rows))])
        same = self.voice_command[(str(self.pool.voices[near]), lab)]
        return int(same[rng.integers(len(same))]), near, lab

    def _per_engine(self, idx: np.ndarray) -> list[np.ndarray]:
        """`idx` split by engine with balance_engines, else as one array."""
        if not self.cfg.balance_engines:
            return [idx]
        engines = self.pool.engines[idx]
        return [idx[engines == e] for e in np.unique(engines)]

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return self.length

    def _pick(self, label: int, rng: np.random.Generator) -> int:
        """A clip of `label`: from a morph with p_morph, else espeak-ng with p_espeak (with
        `balance_engines`, an engine of the group is drawn first); an unknown word is a near
        miss of a command with p_near_miss."""
        groups = [g for g in self.groups if (g, label) in self.by_group]
        if "morph" in groups and (len(groups) == 1 or rng.random() < self.cfg.p_morph):
            g = "morph"
        else:
            groups = [g for g in groups if g != "morph"]
            if len(groups) == 2:
                g = "espeak" if rng.random() < self.cfg.p_espeak else "other"
            else:
                g = groups[0]
        per_engine = self.by_group[(g, label)]
        near = label == UNK and self.cfg.p_near_miss > 0 and g in self.near_by_group
        if near and rng.random() < self.cfg.p_near_miss:  # (no draw when the share is 0)
            per_engine = self.near_by_group[g]
        # (no engine draw for a single array: the default draws the same clips as before)
        idx = per_engine[rng.integers(len(per_engine))] if len(per_engine) > 1 else per_engine[0]
        return int(idx[rng.integers(len(idx))])

    def _event_label(self, rng: np.random.Generator) -> int:
        u = rng.random()
        if u < self.cfg.p_command:
            return int(rng.integers(N_COMMANDS))
        return UNK

    def __getitem__(self, index: int) -> KWSItem:
        cfg, rc = self.cfg, self.cfg.room
        rng = np.random.default_rng([self.seed, 0x77, self.epoch, index])
        n = int(cfg.window_s * SAMPLE_RATE) // cfg.stride * cfg.stride
        n_frames = n // cfg.stride
        x = np.zeros(n, np.float32)
        targets = np.full(n_frames, SIL, np.int64)
        classes = np.full(n_frames, SIL, np.int64)
        domains = np.full(n_frames, IGNORE, np.int64)
        words = np.full(n_frames, IGNORE, np.int64)
        frame_end = (np.arange(n_frames) + 1) * cfg.stride  # sample time of each output
        has_word = rng.random() < cfg.p_command + cfg.p_unknown
        n_words = (2 if rng.random() < cfg.p_two_words else 1) if has_word else 0
        pos = int(rng.uniform(-0.2, cfg.onset_max_s) * SAMPLE_RATE)
        pair: list[int] = []  # a minimal pair's two clips, in the order they are said
        pair_cmd, effects_seed, pair_coded = -1, 0, False
        if has_word and self.pair_near and rng.random() < cfg.p_pair:
            cmd_i, near_i, pair_cmd = self._pick_pair(rng)
            pair = [cmd_i, near_i] if rng.random() < 0.5 else [near_i, cmd_i]
            n_words = 2
            pos = int(rng.uniform(*cfg.pair_onset_s) * SAMPLE_RATE)
            effects_seed = int(rng.integers(2**62))
            pair_coded = self.pool.coded is not None and rng.random() < rc.codec_prob
        power, count = 0.0, 0
        sr = SAMPLE_RATE
        phones: list[int] = []
        whole = self.phonemes is not None  # every word inside the window (a usable target)
        for k in range(n_words):
            if pair:  # both words under the same effects
                i, coded = pair[k], pair_coded
                label = int(self.pool.labels[i])
                fx_rng = np.random.default_rng(effects_seed)
            else:
                label = self._event_label(rng)
                i = self._pick(label, rng)
                coded = self.pool.coded is not None and rng.random() < rc.codec_prob
                fx_rng = rng
            word, speech_len = word_effects(self.pool.audio(i, coded), rc, self.rirs, fx_rng)
            _place(x, word, pos)
            end = pos + speech_len
            if self.phonemes is not None:
                phones += self.phonemes.encode(str(self.pool.words[i]))
                whole = whole and pos >= 0 and end <= n
            seg = word[max(0, -pos) : max(0, min(len(word), n - pos))]
            if seg.size:
                power += float(np.mean(seg.astype(np.float64) ** 2))
                count += 1
            hold_end = end + int(cfg.hold_s * sr)
            settle = (frame_end > pos) & (frame_end <= end + int(cfg.settle_s * sr))
            hold = (frame_end > end + int(cfg.settle_s * sr)) & (frame_end <= hold_end)
            fade = (frame_end > hold_end) & (frame_end <= hold_end + int(cfg.fade_s * sr))
            targets[settle], targets[hold], targets[fade] = IGNORE, label, IGNORE
            cls = UNK + int(self.unknown_class[i]) if self.unknown_class[i] >= 0 else label
            classes[settle], classes[hold], classes[fade] = IGNORE, cls, IGNORE
            span = (frame_end > pos) & (frame_end <= hold_end)
            domains[span], words[span] = self.clip_domain[i], label
            pos = end + int(rng.uniform(0.15, 0.8) * sr)
            if pos >= n:
                break
        babble = [self.pool.audio(int(i)) for i in rng.choice(self._babble_idx, 12)]
        x = _mix(x, power / max(1, count), rng, rc, babble)
        x = channel(x, rc, rng)
        if count:
            x = level(x, rc, rng)
        warp = float(rng.uniform(*cfg.vtlp)) if rng.random() < cfg.vtlp_prob else 1.0
        x = np.clip(x, -1.0, 1.0).astype(np.float32)
        whole = whole and len(phones) <= MAX_PHONES
        padded = torch.zeros(MAX_PHONES, dtype=torch.int64)
        if whole:
            padded[: len(phones)] = torch.tensor(phones, dtype=torch.int64)
        return KWSItem(
            torch.from_numpy(x),
            torch.from_numpy(targets),
            warp,
            torch.from_numpy(domains),
            torch.from_numpy(words),
            padded,
            len(phones) if whole else -1,
            pair_cmd,
            torch.from_numpy(classes),
        )


def clip_windows(
    pool: WordPool,
    indices: Sequence[int],
    rirs: list[np.ndarray],
    seed: int = 0,
    augment: bool = False,
    window_s: float = 1.5,
    room: RoomConfig | None = None,
) -> torch.Tensor:
    """Evaluation windows (len(indices), L): each word ends 0.15-0.45 s before the end."""
    room = room or RoomConfig()
    n = int(window_s * SAMPLE_RATE)
    out = torch.zeros(len(indices), n)
    for row, i in enumerate(indices):
        rng = np.random.default_rng([seed, 0xC11, int(i)])
        word = pool.audio(int(i))
        speech_len = len(word)
        if augment:
            word, speech_len = word_effects(word, room, rirs, rng)
        x = np.zeros(n, np.float32)
        end = n - int(rng.uniform(0.15, 0.45) * SAMPLE_RATE)
        _place(x, word, end - speech_len)
        if augment:
            power = float(np.mean(word.astype(np.float64) ** 2))
            babble = [pool.audio(int(j)) for j in rng.choice(len(pool), 12)]
            x = level(channel(_mix(x, power, rng, room, babble), room, rng), room, rng)
        else:
            x = x + 10 ** (-60 / 20) * rng.standard_normal(n).astype(np.float32)
        out[row] = torch.from_numpy(np.clip(x, -1, 1))
    return out


def silence_windows(
    n_windows: int,
    pool: WordPool | None,
    seed: int = 0,
    window_s: float = 1.5,
    room: RoomConfig | None = None,
) -> torch.Tensor:
    """Word-less evaluation windows (n, L): every background kind and level."""
    room = room or RoomConfig()
    n = int(window_s * SAMPLE_RATE)
    out = torch.zeros(n_windows, n)
    for row in range(n_windows):
        rng = np.random.default_rng([seed, 0x51E, row])
        babble = None
        if pool is not None and len(pool):
            babble = [pool.audio(int(j)) for j in rng.choice(len(pool), 12)]
        x = channel(_mix(np.zeros(n, np.float32), 0.0, rng, room, babble), room, rng)
        out[row] = torch.from_numpy(np.clip(x, -1, 1))
    return out
