"""Continuous test streams for keyword spotting and their scoring (recall, false accepts, delay).

A stream is minutes of audio from one split's voices: commands, unknown words and stretches of
silence/noise at random gaps (0.4-4 s), over a continuous background (coloured noise, hum or
babble at 5-30 dB SNR, changing every ~20 s), each word through the room augmentation
(speed, reverb) and the whole stream through a random channel. Ground truth keeps every word's
label, start and end, and its signal-to-noise ratio (before the channel).

Scoring (:func:`score`) runs the one decision rule (``dlr_runtime.kws.KeywordSpotter``) over
the model's per-frame scores. A command counts as detected when a detection with its label
fires while it is spoken or up to ``max_delay_s`` after its end (a user does not mind a "stop"
recognised before its last sound); every other detection is a false accept (a wrong label, a
second detection of one word, or a detection on unknown words or noise). Delay = detection
time - end of the word (negative when it fired during the word).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from dlr_runtime.kws import Detection, KeywordSpotter, KWSConfig
from training.data.labels import SAMPLE_RATE
from training.data.rooms import RoomConfig, background, channel, word_effects
from training.data.sc12 import SIL, UNK, WordPool


@dataclass(frozen=True)
class Event:
    """One word in a stream (sample positions)."""

    label: int
    word: str
    voice: str
    start: int
    end: int
    snr_db: float = float("nan")  # the word's power against the background's over start..end


@dataclass
class Stream:
    audio: np.ndarray  # float32 (L,)
    events: list[Event] = field(default_factory=list)

    @property
    def hours(self) -> float:
        return len(self.audio) / SAMPLE_RATE / 3600


def build_stream(
    pool: WordPool,
    minutes: float,
    rirs: list[np.ndarray],
    seed: int,
    p_command: float = 0.4,
    p_unknown: float = 0.45,
) -> Stream:
    """A ``minutes``-long stream of ``pool``'s words (deterministic from ``seed``)."""
    rng = np.random.default_rng([seed, 0x57E])
    room = RoomConfig(reverb_prob=0.4)
    n = int(minutes * 60 * SAMPLE_RATE)
    speech = np.zeros(n, np.float32)
    events: list[Event] = []
    cmd_idx = np.flatnonzero(pool.labels < SIL)
    unk_idx = np.flatnonzero(pool.labels == UNK)
    pos = int(rng.uniform(0.5, 2.0) * SAMPLE_RATE)
    while pos < n - 2 * SAMPLE_RATE:
        u = rng.random()
        if u < p_command + p_unknown:
            idx = cmd_idx if u < p_command else unk_idx
            i = int(idx[rng.integers(len(idx))])
            word, speech_len = word_effects(pool.audio(i), room, rirs, rng)
            word = word * np.float32(10 ** (rng.uniform(-12, 0) / 20))
            e = min(n, pos + len(word))
            speech[pos:e] += word[: e - pos]
            events.append(
                Event(
                    int(pool.labels[i]),
                    str(pool.words[i]),
                    str(pool.voices[i]),
                    pos,
                    pos + speech_len,
                )
            )
            pos += len(word)
        else:
            pos += int(rng.uniform(2.0, 8.0) * SAMPLE_RATE)  # a long pause
        pos += int(rng.uniform(0.4, 4.0) * SAMPLE_RATE)
    ref = float(np.sqrt(np.mean(speech[speech != 0].astype(np.float64) ** 2))) if events else 0.1
    out = speech.copy()
    seg = 20 * SAMPLE_RATE
    babble = [pool.audio(int(j)) for j in rng.choice(unk_idx, 64)]
    for s in range(0, n, seg):
        m = min(seg, n - s)
        snr = float(rng.uniform(5.0, 30.0))
        out[s : s + m] += background(m, rng, babble) * np.float32(ref / 10 ** (snr / 20))
    events = [_with_snr(e, speech, out - speech) for e in events]
    out = channel(out, room, rng)
    peak = float(np.max(np.abs(out))) + 1e-9
    out = out * np.float32(min(1.0, 0.9 / peak) * 10 ** (rng.uniform(-10, 0) / 20))
    return Stream(np.clip(out, -1, 1).astype(np.float32), events)


def _with_snr(e: Event, speech: np.ndarray, bg: np.ndarray) -> Event:
    """`e` with its signal-to-noise ratio: speech over background power in its span."""
    sp = np.mean(speech[e.start : e.end].astype(np.float64) ** 2)
    noise = np.mean(bg[e.start : e.end].astype(np.float64) ** 2)
    return replace(e, snr_db=float(10 * np.log10((sp + 1e-20) / (noise + 1e-20))))


@torch.no_grad()
def stream_scores(
    model: torch.nn.Module, audio: np.ndarray, piece_s: float = 60.0, gated: bool = False
) -> np.ndarray:
    """Per-frame class scores (T, C) of one long stream, via the recurrent form in pieces.

    The recurrent form is exact against the offline forward (tests/dlr_runtime), and chunks
    keep memory bounded for hour-long audio. `gated`: through the voice-activity gate as the
    server's continuous mode (`dlr_runtime.listen.gated_scores`; skipped frames score as
    silence).
    """
    from dlr_runtime import to_recurrent
    from dlr_runtime.listen import gated_scores

    rec = to_recurrent(model.cpu().eval(), dtype=torch.complex64)
    if gated:
        return gated_scores(rec, audio)
    state = rec.init_state(1)
    x = torch.from_numpy(audio).unsqueeze(0)
    step = int(piece_s * SAMPLE_RATE)
    outs = []
    for s in range(0, x.shape[1], step):
        y, state = rec.chunk(x[:, s : s + step], state)
        outs.append(y[0].double().numpy())
    return np.concatenate(outs)


@torch.no_grad()
def scores_after_context(
    model: torch.nn.Module, context: torch.Tensor, audio: torch.Tensor, batch: int = 64
) -> torch.Tensor:
    """Last-frame class scores (N, C) of each of `audio` (N, L), run on from the state that
    `context` (S,) leaves behind (the recurrent form, complex64): each clip as if it came
    after that much of a stream, which the offline windows (state from zero) never show.
    """
    from dlr_runtime import to_recurrent

    was = model.training
    rec = to_recurrent(model.eval(), dtype=torch.complex64)  # on the model's device
    model.train(was)
    dev = rec.device
    _, after = rec.chunk(context.to(dev, rec.rdtype).unsqueeze(0), rec.init_state(1))
    outs = []
    for s in range(0, len(audio), batch):
        x = audio[s : s + batch].to(dev, rec.rdtype)
        state = {k: v.expand(len(x), *v.shape[1:]).clone() for k, v in after.items()}
        y, _ = rec.chunk(x, state)  # (b, F, C)
        outs.append(y[:, -1].float().cpu())
    return torch.cat(outs) if outs else torch.zeros(0, 0)


@dataclass
class StreamScore:
    threshold: float
    commands: int
    detected: int
    false_accepts: int
    hours: float
    delays_s: list[float]
    # per command label: commands in the streams, detected, false accepts *with* that label
    commands_by_label: Counter[str] = field(default_factory=Counter)
    detected_by_label: Counter[str] = field(default_factory=Counter)
    false_by_label: Counter[str] = field(default_factory=Counter)

    @property
    def recall(self) -> float:
        return self.detected / max(1, self.commands)

    @property
    def fa_per_hour(self) -> float:
        return self.false_accepts / max(1e-9, self.hours)

    def summary(self) -> dict:
        d = np.array(self.delays_s) if self.delays_s else np.zeros(1)
        return {
            "threshold": self.threshold,
            "commands": self.commands,
            "recall": self.recall,
            "false_accepts": self.false_accepts,
            "fa_per_hour": self.fa_per_hour,
            "hours": self.hours,
            "delay_median_s": float(np.median(d)),
            "delay_p90_s": float(np.quantile(d, 0.9)),
        }


@dataclass
class Matched:
    """One stream's detections matched against its words."""

    hits: list[Event]  # commands detected (each once)
    false: list[Detection]  # detections that matched no command
    delays_s: list[float]  # detection time - end of the word, per hit


def match(
    detections: list[Detection], events: list[Event], labels: list[str], max_delay_s: float = 1.2
) -> Matched:
    """Pair each detection with the first undetected command of its label that it fired
    during or at most ``max_delay_s`` after; the rest are false accepts."""
    cmds = [e for e in events if e.label < SIL]
    used = [False] * len(cmds)
    out = Matched([], [], [])
    for d in detections:
        t = d.end_ms / 1000 * SAMPLE_RATE
        hit = None
        for k, e in enumerate(cmds):
            if used[k] or labels[e.label] != d.label:
                continue
            if e.start <= t <= e.end + max_delay_s * SAMPLE_RATE:
                hit = k
                break
        if hit is None:
            out.false.append(d)
        else:
            used[hit] = True
            out.hits.append(cmds[hit])
            out.delays_s.append((t - cmds[hit].end) / SAMPLE_RATE)
    return out


def score(
    per_stream: list[tuple[np.ndarray, Stream]],
    labels: list[str],
    frame_ms: float,
    config: KWSConfig,
    detections: list[list[Detection]] | None = None,
) -> StreamScore:
    """Recall / false accepts / delays of the decision rule at `config` over every stream
    (`detections`: each stream's, already found at `config`; else the rule runs here)."""
    total = StreamScore(config.threshold, 0, 0, 0, 0.0, [])
    for k, (scores, stream) in enumerate(per_stream):
        if detections is None:
            dets = KeywordSpotter(labels, frame_ms, config).run(scores)
        else:
            dets = detections[k]
        m = match(dets, stream.events, labels)
        cmds = [labels[e.label] for e in stream.events if e.label < SIL]
        total.commands += len(cmds)
        total.detected += len(m.hits)
        total.false_accepts += len(m.false)
        total.hours += stream.hours
        total.delays_s += m.delays_s
        total.commands_by_label.update(cmds)
        total.detected_by_label.update(labels[e.label] for e in m.hits)
        total.false_by_label.update(d.label for d in m.false)
    return total
