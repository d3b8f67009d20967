"""`dlr-export triton`: the config parses as Triton's ModelConfig, and the exported step graph,
driven in ONNX Runtime the way Triton's sequence batcher with implicit state drives it, gives
the runtime's outputs (float32 graph vs complex64 RecurrentModel: max abs error 1e-4), for an
LM, speech models with a running mean, an exponential window with feature normalisation, and
the PCEN and log-mel + PCEN front ends (per-band parameters drawn at random)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from dlr_runtime import DLRConfig, DLRModel, load_recurrent, save_checkpoint
from dlr_runtime.export.cli import main as export_main
from tests.dlr_runtime.test_pcen import randomise

# ONNX export per model repository: full suite only
pytestmark = pytest.mark.slow

model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")
text_format = pytest.importorskip("google.protobuf.text_format")

TOL = 1e-4


NORM = "tiny-speech-norm"  # log-mel, exponential-window head, feature normalisation
PCEN = "tiny-speech-pcen"  # PCEN front end, exponential-window head
BOTH = "tiny-speech-logmel-pcen"  # log-mel and PCEN side by side
SPEECH = ["tiny-speech", NORM, PCEN, BOTH]


@pytest.fixture(scope="module")
def norm_dir(models_dir: Path, tmp_path_factory) -> Path:
    """`models_dir` plus the NORM checkpoint."""
    cfg = DLRConfig.preset(
        "tiny-speech", frontend="logmel", n_mels=10, pool_window_s=0.05, feature_norm_s=0.1
    )
    root = tmp_path_factory.mktemp("norm")
    for name in ("tiny-lm", "tiny-speech"):
        (root / name).symlink_to(models_dir / name)
    save_checkpoint(DLRModel(cfg, seed=4), root / NORM)
    for name, frontend in ((PCEN, "pcen"), (BOTH, "logmel_pcen")):
        model = DLRModel(replace(cfg, frontend=frontend, feature_norm_s=0.0), seed=5)
        randomise(model.encoder.pcen, 6)
        save_checkpoint(model, root / name)
    return root


@pytest.fixture(scope="module")
def repo(norm_dir: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("triton")
    for path in (norm_dir / "tiny-lm", *(norm_dir / name for name in SPEECH)):
        assert export_main(["triton", str(path), str(out), "--max-batch-size", "8"]) == 0
    return out


def _config(repo: Path, name: str):
    return text_format.Parse(
        (repo / name / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()
    )


@pytest.mark.parametrize("name", ["tiny-lm", *SPEECH])
def test_config_is_a_valid_sequence_model(repo, name):
    cfg = _config(repo, name)
    C = model_config_pb2.ModelSequenceBatching.Control
    assert cfg.name == name and cfg.backend == "onnxruntime" and cfg.max_batch_size == 8
    sb = cfg.sequence_batching
    assert sb.max_sequence_idle_microseconds == 60_000_000
    kinds = {c.name: c.control[0].kind for c in sb.control_input}
    assert kinds == {
        "START": C.CONTROL_SEQUENCE_START,
        "READY": C.CONTROL_SEQUENCE_READY,
        "CORRID": C.CONTROL_SEQUENCE_CORRID,
    }
    assert all(len(s.initial_state) == 1 and s.initial_state[0].zero_data for s in sb.state)
    # every tensor the config names exists in the ONNX graph with the same per-sequence dims
    model = onnx.load(str(repo / name / "1" / "model.onnx"))
    onnx.checker.check_model(model, full_check=True)
    graph_in = {i.name: i for i in model.graph.input}
    graph_out = {o.name: o for o in model.graph.output}

    def dims(v):
        return [d.dim_value for d in v.type.tensor_type.shape.dim[1:]]

    assert set(graph_in) == (
        {t.name for t in cfg.input}
        | {c.name for c in sb.control_input}
        | {s.input_name for s in sb.state}
    )
    assert set(graph_out) == {t.name for t in cfg.output} | {s.output_name for s in sb.state}
    for t in cfg.input:
        assert dims(graph_in[t.name]) == list(t.dims)
    for t in cfg.output:
        assert dims(graph_out[t.name]) == list(t.dims)
    for s in sb.state:
        assert dims(graph_in[s.input_name]) == list(s.dims) == dims(graph_out[s.output_name])
    assert (repo / "README.md").read_text().count("tritonserver") >= 1


class TritonLikeDriver:
    """Runs the model like Triton's sequence batcher with implicit state: per-CORRID state kept
    between requests, the zero initial state on START, output states fed back as inputs."""

    def __init__(self, repo: Path, name: str) -> None:
        self.cfg = _config(repo, name)
        self.sess = ort.InferenceSession(str(repo / name / "1" / "model.onnx"))
        self.states: dict[int, dict[str, np.ndarray]] = {}
        self.inputs = {i.name: i for i in self.sess.get_inputs()}

    def _zeros(self) -> dict[str, np.ndarray]:
        out = {}
        for s in self.cfg.sequence_batching.state:
            dt = np.float64 if s.data_type == model_config_pb2.TYPE_FP64 else np.float32
            out[s.input_name] = np.zeros(list(s.dims), dtype=dt)
        return out

    def run(self, requests: list[tuple[int, bool, np.ndarray]], idle_slots: int = 0, stale=False):
        """requests: (corrid, start, x); returns one output row per request. `idle_slots` adds
        READY=0 rows holding random state; `stale` feeds old state (not zeros) on START."""
        rows, start, ready, corr = [], [], [], []
        rng = np.random.default_rng(0)
        for cid, st, x in requests:
            state = self.states.get(cid) if (stale or not st) else None
            rows.append((x, self._zeros() if state is None else state))
            start.append(int(st))
            ready.append(1)
            corr.append(cid)
        for _ in range(idle_slots):
            junk = {
                k: rng.standard_normal(v.shape).astype(v.dtype) for k, v in self._zeros().items()
            }
            rows.append((np.zeros_like(rows[0][0]), junk))
            start.append(0)
            ready.append(0)
            corr.append(0)
        x_name = self.cfg.input[0].name
        feed = {x_name: np.stack([r[0] for r in rows])}
        for k in rows[0][1]:
            feed[k] = np.stack([r[1][k] for r in rows])
        feed["START"] = np.array(start, dtype=np.int32)[:, None]
        feed["READY"] = np.array(ready, dtype=np.int32)[:, None]
        feed["CORRID"] = np.array(corr, dtype=np.uint64)[:, None]
        names = [o.name for o in self.sess.get_outputs()]
        outs = dict(zip(names, self.sess.run(None, feed), strict=True))
        for j, (cid, _, _) in enumerate(requests):
            self.states[cid] = {
                s.input_name: outs[s.output_name][j] for s in self.cfg.sequence_batching.state
            }
        n = len(requests)
        for s in self.cfg.sequence_batching.state:  # READY=0 rows keep their state
            np.testing.assert_array_equal(outs[s.output_name][n:], feed[s.input_name][n:])
        return outs[self.cfg.output[0].name][:n]


def test_lm_sequences_match_runtime(repo, models_dir):
    rec = load_recurrent(models_dir / "tiny-lm")
    drv = TritonLikeDriver(repo, "tiny-lm")
    gen = torch.Generator().manual_seed(0)
    seqs = {
        11: torch.randint(0, 258, (9,), generator=gen),
        12: torch.randint(0, 258, (6,), generator=gen),
    }
    ref = {cid: rec.chunk(t[None], rec.init_state(1))[0][0] for cid, t in seqs.items()}  # (T, V)
    for pos in range(9):
        reqs = [
            (cid, pos == 0, t[pos : pos + 1].numpy()) for cid, t in seqs.items() if pos < len(t)
        ]
        got = drv.run(reqs, idle_slots=pos % 3)
        for (cid, _, _), y in zip(reqs, got, strict=True):
            np.testing.assert_allclose(y, ref[cid][pos].numpy(), atol=TOL, rtol=0)
    # a new sequence reusing CORRID 11 starts from zero even if stale state is fed in
    t = seqs[12]
    got = drv.run([(11, True, t[:1].numpy())], stale=True)
    np.testing.assert_allclose(got[0], ref[12][0].numpy(), atol=TOL, rtol=0)


@pytest.mark.parametrize("name", SPEECH)
def test_speech_sequence_matches_runtime(repo, norm_dir, name):
    """Two sequences frame by frame with an idle slot, then a new sequence reusing CORRID 1
    with stale state fed in: the running mean (tiny-speech), the exponential window with
    feature normalisation (NORM) and PCEN's smoother (PCEN, BOTH) all restart from zero."""
    rec = load_recurrent(norm_dir / name)
    stride = rec.config.frame_stride
    drv = TritonLikeDriver(repo, name)
    audio = torch.randn(2, 5 * stride, generator=torch.Generator().manual_seed(1)) * 0.3
    ref, _ = rec.chunk(audio, rec.init_state(2))  # (2, 5, C): scores after each frame
    for f in range(5):
        frames = audio[:, f * stride : (f + 1) * stride].numpy()
        got = drv.run([(1, f == 0, frames[0]), (2, f == 0, frames[1])], idle_slots=1)
        np.testing.assert_allclose(got, ref[:, f].numpy(), atol=TOL, rtol=0)
    got = drv.run([(1, True, audio[1, :stride].numpy())], stale=True)
    np.testing.assert_allclose(got[0], ref[1, 0].numpy(), atol=TOL, rtol=0)


def test_cli_errors(tmp_path, models_dir, capsys):
    assert export_main(["triton", str(tmp_path / "missing"), str(tmp_path / "o")]) == 2
    assert "cannot load checkpoint" in capsys.readouterr().err
    bad = ["triton", str(models_dir / "tiny-lm"), str(tmp_path / "o"), "--name", "a b"]
    assert export_main(bad) == 2
    assert "model name" in capsys.readouterr().err
