"""Tiny end-to-end runs of every recipe through the real command line (a few steps each)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dlr_runtime import load_checkpoint, load_recurrent, read_header
from training.cli import main
from training.data.labels import SC10_LABELS
from training.plain_checkpoint import read_plain_header

from .conftest import QUIET, TINY_LM, TINY_MODEL


def _run_files(out: Path) -> None:
    for name in ("run.json", "metrics.jsonl", "metrics.csv", "curves.png", "summary.json"):
        assert (out / name).is_file(), name
    kinds = {json.loads(line)["kind"] for line in (out / "metrics.jsonl").read_text().splitlines()}
    assert kinds == {"train", "eval"}
    assert (out / "last" / "train_state.safetensors").is_file()


def test_speech_recipe_on_a_handful_of_espeak_clips(tmp_path: Path) -> None:
    pytest.importorskip("training.data.speech_synth")
    from training.data.espeak import find_espeak

    try:
        find_espeak()
    except Exception as e:  # noqa: BLE001 - the message says how to install it
        pytest.skip(str(e))
    out = tmp_path / "speech"
    argv = [
        "speech",
        "--out-dir",
        str(out),
        "--cache-dir",
        str(tmp_path / "cache"),
        "--accents",
        "en-us",
        "--variants",
        "m1,f1,m3",
        "--renditions",
        "1",
        "--batch-size",
        "4",
        "--epochs",
        "2",
        "--num-workers",
        "0",
        "--frame-stride",
        "400",
        "--stream-clips",
        "4",
        "--warmup",
        "1",
        *TINY_MODEL,
        *QUIET,
    ]
    assert main(argv) == 0
    _run_files(out)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 4  # 10 train clips // batch 4 = 2 steps x 2 epochs
    assert summary["test"]["clips"] == 10.0
    for form in ("complex64", "complex128"):
        check = summary["streaming"][form]
        assert check["chunk_samples"] == 1600
        assert check["final_prediction_agreement"] == 1.0
        assert check["max_abs_score_diff"] < 1e-4
    model = load_checkpoint(out / "model")
    assert tuple(model.config.labels) == SC10_LABELS
    assert model.config.encoder == "audio" and model.config.frame_stride == 400
    assert model.checkpoint_metadata["training"]["recipe"] == "speech"


@pytest.mark.parametrize("arch", ["dlr", "transformer"])
def test_lm_recipe(tmp_path: Path, text_dir: Path, arch: str) -> None:
    out = tmp_path / arch
    argv = ["lm", "--text", str(text_dir), "--out-dir", str(out), "--arch", arch, *TINY_LM]
    assert main(argv) == 0
    _run_files(out)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["epochs_done"] == 2
    assert 0 < summary["test"]["bpb"] < 12
    assert len(summary["samples"]) == 3 and (out / "samples.txt").is_file()
    if arch == "dlr":
        header = read_header(out / "model")
        assert header["metadata"]["tokenizer"] == {
            "type": "bytes",
            "bos": 256,
            "eos": 257,
            "vocab_size": 258,
        }
        rec = load_recurrent(out / "model", dtype=torch.complex64, device="cpu")
        assert summary["state_bytes_per_session"] == rec.state_bytes_per_session()
        # a checkpoint written mid-run names the run's options too (dlr-eval reads its split)
        last = read_header(out / "last")["metadata"]["training"]
        assert last["progress"] == "in training" and last["step"] == 4
        assert last["recipe_options"] == summary["recipe_options"]
    else:
        header = read_plain_header(out / "model")
        assert header["arch"] == "transformer-lm"
        assert header["metadata"]["tokenizer"]["vocab_size"] == 258


def test_synthetic_recipe(tmp_path: Path) -> None:
    out = tmp_path / "syn"
    argv = [
        "synthetic",
        "--task",
        "shift",
        "--length",
        "16",
        "--out-dir",
        str(out),
        "--steps",
        "3",
        "--steps-per-epoch",
        "3",
        "--batch-size",
        "4",
        "--heldout-batches",
        "1",
        *TINY_MODEL,
        *QUIET,
    ]
    assert main(argv) == 0
    _run_files(out)
    summary = json.loads((out / "summary.json").read_text())
    assert 0.0 <= summary["test"]["score"] <= 1.0


def test_suite_writes_table_and_plot(tmp_path: Path) -> None:
    out = tmp_path / "suite"
    argv = [
        "suite",
        "--length",
        "8",
        "--steps",
        "2",
        "--batch-size",
        "4",
        "--tasks",
        "reverse",
        "--heldout-batches",
        "1",
        "--out-dir",
        str(out),
        "--work-dir",
        str(tmp_path / "work"),
        "--d-model",
        "16",
        "--d-state",
        "8",
        "--n-layers",
        "1",
        "--threads",
        "1",
    ]
    assert main(argv) == 0
    table = (out / "results.md").read_text()
    assert "| reverse |" in table and "| task | dlr | attention |" in table
    assert "dlr-train suite --length 8" in table
    assert (out / "scores.png").stat().st_size > 1000
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert {(r["task"], r["arch"]) for r in rows} == {
        ("reverse", "dlr"),
        ("reverse", "attention"),
    }


def test_bad_options_fail_with_a_clear_message(tmp_path: Path, capsys) -> None:
    assert (
        main(["lm", "--text", str(tmp_path / "missing"), "--out-dir", str(tmp_path / "x"), *QUIET])
        == 2
    )
    assert "does not exist" in capsys.readouterr().err
    assert main(["lm", "--layer", "mamba", "--out-dir", str(tmp_path / "y"), *QUIET]) == 2
    assert "layer" in capsys.readouterr().err
    assert main(["synthetic", "--task", "nope", "--out-dir", str(tmp_path / "z"), *QUIET]) == 2
    assert "unknown task" in capsys.readouterr().err
    assert main(["speech", "--frame-stride", "7", "--out-dir", str(tmp_path / "w"), *QUIET]) == 2
    assert "frame-stride" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_lm_recipe_on_cuda_with_bfloat16_autocast(tmp_path: Path, text_dir: Path) -> None:
    out = tmp_path / "cuda"
    argv = ["lm", "--text", str(text_dir), "--out-dir", str(out), "--device", "cuda", "--amp"]
    argv += TINY_LM
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["hardware"]["gpu"] and 0 < summary["test"]["bpb"] < 12


def test_speech_recipe_reads_the_speech_commands_layout(tmp_path: Path) -> None:
    """`--data real` on a small folder in the v0.02 layout with the official split lists."""
    sf = pytest.importorskip("soundfile")
    import numpy as np

    root = tmp_path / "speech_commands_v0.02"
    rng = np.random.default_rng(0)
    valid, test = [], []
    for word in (*SC10_LABELS, "bed"):  # "bed" is not an SC10 word: ignored
        (root / word).mkdir(parents=True)
        for i in range(4):
            name = f"{word}/spk{i}_nohash_0.wav"
            sf.write(root / name, 0.1 * rng.standard_normal(8000).astype(np.float32), 16000)
            (valid if i == 2 else test if i == 3 else []).append(name)
    (root / "validation_list.txt").write_text("\n".join(valid) + "\n")
    (root / "testing_list.txt").write_text("\n".join(test) + "\n")
    out = tmp_path / "real"
    argv = ["speech", "--data", "real", "--data-root", str(tmp_path), "--out-dir", str(out)]
    argv += ["--batch-size", "5", "--epochs", "1", "--num-workers", "0", "--frame-stride", "800"]
    argv += ["--stream-clips", "2", "--warmup", "1", *TINY_MODEL, *QUIET]
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 4  # 20 train clips (2 per word) // batch 5
    assert summary["test"]["clips"] == 10.0 and "test_augmented" not in summary
    assert summary["streaming"]["complex64"]["final_prediction_agreement"] == 1.0


def test_command_line_comes_from_the_option_dataclasses(capsys) -> None:
    from training.cli import SuiteArgs, parse

    args = parse(["synthetic", "--width", "32", "--layers", "1", "--no-progress", "--task", "copy"])
    assert (args.recipe, args.model.d_model, args.model.n_layers) == ("synthetic", 32, 1)
    assert args.train.progress is False and args.options.task == "copy"
    assert args.train.epochs == 5  # the recipe's own default, not TrainConfig's
    suite = parse(["suite", "--tasks", "copy", "cumsum", "--betas", "0.8", "0.9"])
    assert isinstance(suite, SuiteArgs) and suite.suite.tasks == ("copy", "cumsum")
    assert suite.train.betas == (0.8, 0.9)
    with pytest.raises(SystemExit) as bad:
        parse(["lm", "--no-such-flag", "1"])
    assert bad.value.code == 2
    with pytest.raises(SystemExit):
        parse(["lm", "--help"])
    helptext = capsys.readouterr().out
    assert "peak learning rate of the SSM layers" in helptext  # TrainConfig's field comment
    assert "training window in bytes" in helptext  # LMOptions' field comment
