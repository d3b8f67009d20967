"""Continuous listening (dlr_runtime.listen + vad): the gate's state rule is exact.

- `KeywordSpotter.skip(n)` is bit-identical to n pushes of the quiet posterior;
- a gated stream computes, with ``on_open="resume"`` (the default), the frames the gate lets
  through once each and in order from one state, and with ``"reset"`` each open segment as a
  fresh ungated stream of that segment's audio (pre-roll included): float64 / complex128 rows
  to 1e-10 against the plain recurrent chunk, and the detections equal a plain loop of the
  detector over (quiet posterior for skipped frames, reference rows for computed ones);
- decisions, detections and the listener's snapshot do not depend on the chunking;
- the gate disabled == the ungated model on the whole stream; snapshot/restore mid-stream
  continues exactly.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from dlr_runtime import DLRConfig, DLRModel, to_recurrent
from dlr_runtime.backends import make_backend
from dlr_runtime.engine import Engine
from dlr_runtime.kws import KeywordSpotter, KWSConfig, detect
from dlr_runtime.listen import Listener, feed_listening, gated_scores
from dlr_runtime.vad import Gate, GateConfig

LABELS = ["yes", "no", "stop", "_silence_", "_unknown_"]
RATE, STRIDE = 16000, 160
F64_TOL = 1e-10


@pytest.fixture(scope="module", params=[0.0, 0.3], ids=["plain", "feature-norm"])
def model(request):
    """A log-mel model with an exponential-window head; with or without feature normalisation
    (whose state the gate's reset restarts like every other state tensor)."""
    cfg = DLRConfig(
        d_model=8, d_state=6, n_layers=2, encoder="audio", decoder="classifier", labels=LABELS,
        frame_stride=STRIDE, frontend="logmel", n_mels=10, pool_window_s=0.5, dt_min=0.01,
        dt_max=0.5, sample_rate=RATE, feature_norm_s=request.param,
    )  # fmt: skip
    torch.manual_seed(0)
    m = DLRModel(cfg, seed=3)
    with torch.no_grad():  # sharper scores so that commands fire at moderate thresholds
        m.head.proj.weight.mul_(6.0)
    return to_recurrent(m, dtype=torch.complex128)


def make_engine(rec) -> Engine:
    return Engine(make_backend(rec, "torch"), "tiny", 4)


def voice(seconds: float, f0: float) -> np.ndarray:
    t = np.arange(int(RATE * seconds)) / RATE
    return (0.3 * ((t * f0) % 1 - 0.5)).astype(np.float32)


def quiet(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (1e-4 * rng.standard_normal(int(RATE * seconds))).astype(np.float32)


def stream() -> np.ndarray:
    parts = [quiet(1.0, 1), voice(0.5, 140), quiet(1.5, 2), voice(0.4, 220), quiet(0.3, 3)]
    parts += [voice(0.3, 180), quiet(1.2, 4)]
    return np.concatenate(parts)


class Recorder:
    """The real engine, keeping each stream's computed rows and resets (for the reference)."""

    def __init__(self, eng: Engine) -> None:
        self.eng, self.log, self.config = eng, [], eng.config

    def reset(self, slot: int) -> None:
        self.log.append(("reset", slot, None, None))
        self.eng.reset(slot)

    def feed_audio(self, slots, chunks):
        ys = self.eng.feed_audio(slots, chunks)
        for s, x, y in zip(slots, chunks, ys, strict=True):
            self.log.append(("feed", s, x.numpy().copy(), y.clone()))
        return ys


def listen(eng, x: np.ndarray, chunk_frames: int, kws: KWSConfig, gate: GateConfig | None = None):
    rec_eng = Recorder(eng)
    slot = eng.open()
    lis = Listener(LABELS, STRIDE, RATE, kws, gate)
    step = chunk_frames * STRIDE
    heard = []
    for i in range(0, x.size, step):
        heard += feed_listening(rec_eng, [slot], [lis], [torch.from_numpy(x[i : i + step])])
    eng.close(slot)
    return lis, heard, rec_eng.log


def same(a, b) -> bool:
    """Equal detections (scores to float64 rounding)."""
    key = [(d.label, d.start_ms, d.end_ms, d.frame) for d in a]
    return key == [(d.label, d.start_ms, d.end_ms, d.frame) for d in b] and all(
        abs(x.score - y.score) < 1e-9 for x, y in zip(a, b, strict=True)
    )


def kws_config() -> KWSConfig:
    return KWSConfig(threshold=0.45, smooth_ms=50, refractory_ms=300)


def test_skip_equals_quiet_pushes():
    rng = np.random.default_rng(0)
    cfg = KWSConfig(threshold=0.4, smooth_ms=60, refractory_ms=100)
    a, b = KeywordSpotter(LABELS, 10, cfg), KeywordSpotter(LABELS, 10, cfg)
    for n in (0, 1, 3, 6, 50, 1):
        for _ in range(int(rng.integers(1, 30))):
            row = 4 * rng.standard_normal(len(LABELS))
            assert a.push(row) == b.push(row)
        a.skip(n)
        for _ in range(n):
            assert b.push_posterior(b.quiet()) is None
        assert a.snapshot() == b.snapshot()
        c = KeywordSpotter(LABELS, 10, cfg)  # restored mid-silence: the shortcut resumes
        c.restore(a.snapshot())
        assert c.quiet_rows == (a.k if n >= a.k else 0)
        c.skip(7)
        for _ in range(7):
            b.push_posterior(b.quiet())
        assert c.snapshot() == b.snapshot()
        a.restore(c.snapshot())


def fed_frames(x: np.ndarray, chunk_frames: int, gate_cfg: GateConfig) -> list[range]:
    """The frames of `x` each computed run covers (pre-roll included), from a plain gate loop."""
    gate, pos, out = Gate(STRIDE, RATE, gate_cfg), 0, []
    for i in range(0, x.size, chunk_frames * STRIDE):
        for run in gate.plan(x[i : i + chunk_frames * STRIDE]):
            if run.feed:
                out.append(range(pos - run.lead, pos + run.frames))
            pos += run.frames
    return out


@pytest.mark.parametrize("on_open", ["resume", "reset"])
def test_gate_state_rule_is_exact(model, on_open):
    """resume: the state runs over the computed frames, each once and in order; reset: each
    open segment == a fresh ungated stream of its audio. Detections == plain loop."""
    eng = make_engine(model)
    x = stream()
    gate_cfg = GateConfig(on_open=on_open)
    lis, heard, log = listen(eng, x, 7, kws_config(), gate_cfg)
    # most of the 4 s of quiet is not computed: the 1 s before the first word and the 1.5 s
    # and 1.2 s gaps, less the 0.6 s hangover after each word (250 of 400 frames)
    assert sum(h.skipped for h in heard) >= 250
    assert sum(h.computed for h in heard) < 0.6 * (x.size // STRIDE)
    fed = np.concatenate([samples for kind, _, samples, _ in log if kind == "feed"])
    spans = fed_frames(x, 7, gate_cfg)
    assert fed.size == sum(len(r) for r in spans) * STRIDE
    assert np.array_equal(
        fed, np.concatenate([x[r.start * STRIDE : r.stop * STRIDE] for r in spans])
    )
    if on_open == "resume":  # no frame twice, in order
        assert all(a.stop <= b.start for a, b in itertools.pairwise(spans))
    # reference: plain chunk from zero, restarted at each reset
    state, n_resets = model.init_state(1), 0
    for kind, _, samples, y in log:
        if kind == "reset":
            state, n_resets = model.init_state(1), n_resets + 1
            continue
        ref, state = model.chunk(torch.from_numpy(samples).double().unsqueeze(0), state)
        assert torch.allclose(y.double(), ref[0], atol=F64_TOL, rtol=0), "segment row mismatch"
    # the 0.3 s gap is inside the 0.6 s hangover: segments 2 and 3 merge
    assert n_resets == (2 if on_open == "reset" else 0)
    # the detector over (quiet for skipped, computed rows without pre-roll) in a plain loop
    gate = Gate(STRIDE, RATE, gate_cfg)
    spot = KeywordSpotter(LABELS, 10.0, kws_config())
    dets = []
    feeds = iter([e for e in log if e[0] == "feed"])
    for i in range(0, x.size, 7 * STRIDE):
        for run in gate.plan(x[i : i + 7 * STRIDE]):
            if not run.feed:
                for _ in range(run.frames):
                    assert spot.push_posterior(spot.quiet()) is None
                continue
            got = []  # the run's rows, fed in power-of-two pieces
            while sum(y.shape[0] for y in got) < run.lead + run.frames:
                got.append(next(feeds)[3])
            rows = torch.cat(got)[run.lead :]
            dets += [d for d in map(spot.push, rows.numpy()) if d is not None]
    assert dets == lis.detections
    assert dets, "the test model should fire at this threshold"
    assert lis.spotter.snapshot() == spot.snapshot()


def test_gated_scores_make_the_listeners_detections(model):
    """The evaluation's whole-stream twin of the listening path: the detector run over
    `gated_scores` fires exactly as the chunked Listener does (gate on, either way, and off)."""
    eng = make_engine(model)
    x = stream()
    for gate in (GateConfig(), GateConfig(on_open="reset"), GateConfig(enabled=False)):
        lis, heard, _ = listen(eng, x, 7, kws_config(), gate)
        rows = gated_scores(model, x, gate)
        assert rows.shape == (x.size // STRIDE, len(LABELS))
        dets = KeywordSpotter(LABELS, 10.0, kws_config()).run(rows)
        assert same(dets, lis.detections) and dets
        skipped = np.isinf(rows).any(axis=1)
        assert int(skipped.sum()) == sum(h.skipped for h in heard)


@pytest.mark.parametrize("on_open", ["resume", "reset"])
def test_chunking_does_not_change_anything(model, on_open):
    eng = make_engine(model)
    x = stream()
    gate = GateConfig(on_open=on_open)
    runs = [listen(eng, x, n, kws_config(), gate)[0] for n in (1, 2, 10, 64, 1000)]
    first = runs[0]
    for lis in runs[1:]:
        assert same(lis.detections, first.detections)
        assert lis.gate.snapshot() == first.gate.snapshot()


def test_gate_disabled_equals_ungated_stream(model):
    eng = make_engine(model)
    x = stream()
    lis, heard, _ = listen(eng, x, 16, kws_config(), GateConfig(enabled=False))
    assert sum(h.skipped for h in heard) == 0
    ref, _ = model.chunk(torch.from_numpy(x).double().unsqueeze(0), model.init_state(1))
    assert same(lis.detections, detect(ref[0].numpy(), LABELS, 10.0, kws_config()))


@pytest.mark.parametrize("on_open", ["resume", "reset"])
def test_snapshot_restore_mid_stream_continues_exactly(model, on_open):
    eng = make_engine(model)
    x = stream()
    gate = GateConfig(on_open=on_open)
    whole, _, _ = listen(eng, x, 8, kws_config(), gate)
    slot = eng.open()
    lis = Listener(LABELS, STRIDE, RATE, kws_config(), gate)
    cut = 175 * STRIDE  # inside the first voiced segment's hangover
    feed_listening(eng, [slot], [lis], [torch.from_numpy(x[:cut])])
    blob, snap = eng.snapshot(slot), lis.snapshot()
    eng.close(slot)
    slot2 = eng.open()
    eng.restore(slot2, blob)
    back = Listener.restore(snap, LABELS, STRIDE, RATE)
    for i in range(cut, x.size, 8 * STRIDE):
        feed_listening(eng, [slot2], [back], [torch.from_numpy(x[i : i + 8 * STRIDE])])
    assert same(back.detections, whole.detections)
    assert back.n_detections == whole.n_detections


def test_batched_streams_equal_solo(model):
    eng = make_engine(model)
    xs = [stream(), np.concatenate([quiet(0.7, 9), stream()])[: stream().size]]
    solo = [listen(eng, x, 5, kws_config())[0].detections for x in xs]
    slots = [eng.open() for _ in xs]
    lis = [Listener(LABELS, STRIDE, RATE, kws_config()) for _ in xs]
    for i in range(0, xs[0].size, 5 * STRIDE):
        feed_listening(eng, slots, lis, [torch.from_numpy(x[i : i + 5 * STRIDE]) for x in xs])
    for s, ref in zip(lis, solo, strict=True):
        assert same(s.detections, ref) and ref


def test_gate_skips_steady_noise_and_passes_voice_over_it():
    rng = np.random.default_rng(5)
    noise = (0.01 * rng.standard_normal(RATE * 6)).astype(np.float32)  # -40 dBFS white
    x = noise.copy()
    x[RATE * 4 : RATE * 4 + 8000] += voice(0.5, 150)
    gate = Gate(STRIDE, RATE)
    decided = []
    for i in range(0, x.size, 10 * STRIDE):
        for run in gate.plan(x[i : i + 10 * STRIDE]):
            decided += [run.feed] * run.frames
    decided = np.array(decided)
    assert not decided[:400].any()  # 4 s of steady noise: never computed
    assert decided[400:450].all()  # the voice over the noise opens the gate
    assert not decided[520:].any()  # closed again 0.6 s (the hangover) after the voice ends


def test_gate_snapshot_round_trip_mid_noise():
    rng = np.random.default_rng(6)
    x = (0.01 * rng.standard_normal(RATE * 3)).astype(np.float32)
    x[RATE : RATE + 4800] += voice(0.3, 200)
    a, cut = Gate(STRIDE, RATE), 130 * STRIDE
    whole = [(r.feed, r.frames, r.reset, r.lead) for r in a.plan(x)]
    b = Gate(STRIDE, RATE)
    first = [(r.feed, r.frames, r.reset, r.lead) for r in b.plan(x[:cut])]
    c = Gate(STRIDE, RATE)
    c.restore(b.snapshot())
    rest = [(r.feed, r.frames, r.reset, r.lead) for r in c.plan(x[cut:])]
    frames = lambda runs: [f for feed, n, _, _ in runs for f in [feed] * n]  # noqa: E731
    assert frames(first + rest) == frames(whole)
    assert c.snapshot() == a.snapshot()


@pytest.mark.parametrize("on_open", ["resume", "reset"])
def test_preroll_after_a_short_closure(on_open):
    """Closed for fewer frames than the pre-roll: resume feeds only the frames it skipped,
    reset the whole pre-roll (computed ones again, into a fresh state)."""
    parts = [quiet(0.5, 7), voice(0.3, 150), quiet(0.7, 8), voice(0.3, 150), quiet(0.2, 9)]
    cfg = GateConfig(on_open=on_open)
    runs = Gate(STRIDE, RATE, cfg).plan(np.concatenate(parts))
    assert [r.feed for r in runs] == [False, True, False, True]
    closed, reopened = runs[2].frames, runs[3]
    n_pre = int(cfg.preroll_ms / 10)
    assert 0 < closed < n_pre  # 0.7 s of quiet, 0.6 s of hangover
    assert reopened.lead == (closed if on_open == "resume" else n_pre)
    assert reopened.reset == (on_open == "reset")
    assert runs[1].lead == n_pre and runs[1].reset == (on_open == "reset")  # the first word


def test_gate_restores_a_snapshot_without_the_closed_count():
    """Snapshots from before "resume" have no closed-frame count: a full pre-roll is assumed."""
    gate = Gate(STRIDE, RATE)
    gate.plan(quiet(0.5, 3))
    snap = gate.snapshot()
    assert snap["shut"] == gate.n_pre
    del snap["shut"]
    back = Gate(STRIDE, RATE)
    back.restore(snap)
    assert back.shut == gate.n_pre
    with pytest.raises(ValueError):
        back.restore({**gate.snapshot(), "shut": gate.n_pre + 1})
    with pytest.raises(ValueError):
        GateConfig(on_open="warm")


def _reference_detections(
    posts: np.ndarray, frame_ms: float, schedule: list[tuple[int, KWSConfig]]
) -> list[tuple[str, int]]:
    """A plain loop of the decision rule whose operating point changes at given frames."""
    commands = [c for c in LABELS if not c.startswith("_")]
    k = max(1, int(round(schedule[0][1].smooth_ms / frame_ms)))
    armed = {c: True for c in commands}
    rise = {c: 0 for c in commands}
    listen: list[str] = []
    last, out = -(10**9), []
    for t in range(len(posts)):
        cfg = [c for f, c in schedule if f <= t][-1]
        now = cfg.listen or commands
        for c in now:
            if c not in listen:  # (newly listened: starts armed)
                armed[c], rise[c] = True, t
        listen = list(now)
        smooth = posts[max(0, t - k + 1) : t + 1].mean(axis=0)
        hot = []
        for c in listen:
            thr = cfg.keywords.get(c, cfg.threshold)
            s = smooth[LABELS.index(c)]
            if s < cfg.rearm * thr:
                armed[c], rise[c] = True, t + 1
            if s >= thr and armed[c]:
                hot.append((s, -listen.index(c), c))
        if hot and t - last >= int(round(cfg.refractory_ms / frame_ms)):
            c = max(hot)[2]
            armed[c], last = False, t
            out.append((c, t))
    return out


def test_reconfigure_mid_stream_equals_the_plain_rule():
    rng = np.random.default_rng(5)
    frames, frame_ms = 900, 10.0
    logits = rng.standard_normal((frames, len(LABELS)))
    for start in range(0, frames, 45):  # a burst of one label every 0.45 s
        logits[start : start + 12, int(rng.integers(0, len(LABELS)))] += 6
    posts = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    base = KWSConfig(threshold=0.5, smooth_ms=50, refractory_ms=200)
    schedule = [
        (0, base),
        (200, KWSConfig(threshold=0.8, smooth_ms=50, refractory_ms=200)),
        (420, KWSConfig(threshold=0.4, keywords={"stop": 0.7}, smooth_ms=50, refractory_ms=0)),
        (600, KWSConfig(threshold=0.4, listen=["yes", "stop"], smooth_ms=50, refractory_ms=300)),
        (750, base),
    ]
    sp = KeywordSpotter(LABELS, frame_ms, base)
    got = []
    for t in range(frames):
        for f, cfg in schedule[1:]:
            if f == t:
                sp.reconfigure(cfg)
        d = sp.push_posterior(posts[t])
        if d is not None:
            got.append((d.label, d.frame))
    want = _reference_detections(posts, frame_ms, schedule)
    assert got == want and len({f for f, _ in schedule if any(g[1] >= f for g in got)}) == 5
    # the same config again changes nothing; a bad one changes nothing and says why
    a, b = KeywordSpotter(LABELS, frame_ms, base), KeywordSpotter(LABELS, frame_ms, base)
    for t in range(300):
        if t == 100:
            b.reconfigure(KWSConfig(threshold=0.5, smooth_ms=50, refractory_ms=200))
            with pytest.raises(ValueError, match="unknown keyword"):
                b.reconfigure(KWSConfig(keywords={"maybe": 0.5}, smooth_ms=50))
            with pytest.raises(ValueError, match="smooth_ms"):
                b.reconfigure(KWSConfig(smooth_ms=200))
        assert a.push_posterior(posts[t]) == b.push_posterior(posts[t])
    assert a.snapshot() == b.snapshot() and b.config == base
