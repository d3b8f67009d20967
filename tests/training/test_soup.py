"""Weight averaging of fine-tuned runs (`training.soup`): the mean of the weights, the contract
that refuses runs which cannot be averaged, and a soup run directory that reads like a
training run's (checkpoint, summary with the recipe's results, curves)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from dlr_runtime import load_checkpoint, load_recurrent, save_checkpoint
from training.cli import main as train_main
from training.soup import SoupError, average_state, check_ingredients, read_ingredient
from training.soup import main as soup_main

from .conftest import TINY_LM, write_corpus


def test_average_state_is_the_mean_in_float64() -> None:
    a = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor([3])}
    b = {"w": torch.tensor([2.0, 4.0 + 1e-7]), "n": torch.tensor([3])}
    got = average_state([a, b])
    assert got["w"].dtype == torch.float32 and torch.equal(got["n"], torch.tensor([3]))
    assert torch.equal(got["w"], ((a["w"].double() + b["w"].double()) / 2).float())
    with pytest.raises(SoupError, match="not floating point and differs"):
        average_state([a, {**b, "n": torch.tensor([4])}])
    with pytest.raises(SoupError, match="different shapes"):
        average_state([a, {**b, "w": torch.zeros(3)}])


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A base LM run, two fine-tunes of it (different learning rates) and a run from scratch."""
    root = tmp_path_factory.mktemp("soup")
    text = write_corpus(root / "corpus")
    base = ["lm", "--text", str(text), "--arch", "dlr", *TINY_LM]
    out = {name: root / name for name in ("base", "ft_a", "ft_b", "other")}
    assert train_main([*base, "--out-dir", str(out["base"])]) == 0
    init = ["--init-from", str(out["base"] / "model")]
    assert train_main([*base, "--out-dir", str(out["ft_a"]), *init, "--lr", "0.01"]) == 0
    assert train_main([*base, "--out-dir", str(out["ft_b"]), *init, "--lr", "0.003"]) == 0
    assert train_main([*base, "--out-dir", str(out["other"]), "--seed", "1"]) == 0
    return {**out, "text": text}


def test_soup_of_two_fine_tunes(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "soup"
    assert soup_main([str(runs["ft_a"]), str(runs["ft_b"]), "--out", str(out)]) is None
    a = load_checkpoint(runs["ft_a"] / "model").state_dict()
    b = load_checkpoint(runs["ft_b"] / "model").state_dict()
    assert not all(torch.equal(a[k], b[k]) for k in a)  # the fine-tunes differ
    soup = load_checkpoint(out / "model")
    for name, t in soup.state_dict().items():
        assert torch.allclose(t, (a[name] + b[name]) / 2, atol=1e-6), name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["command"].startswith("python -m training.soup ")
    assert summary["soup"]["init_from"] == str(runs["base"] / "model")
    assert [Path(i["run"]).name for i in summary["soup"]["ingredients"]] == ["ft_a", "ft_b"]
    assert summary["steps"] == 8  # the ingredients' steps together
    # the recipe's final results, recomputed on the average (not copied from an ingredient)
    assert 0 < summary["test"]["bpb"] < 12
    assert summary["test"] != json.loads((runs["ft_a"] / "summary.json").read_text())["test"]
    meta = soup.checkpoint_metadata
    assert meta["tokenizer"]["type"] == "bytes" and "soup" in meta["training"]
    assert (out / "curves.png").stat().st_size > 0 and (out / "metrics.csv").is_file()
    rec = load_recurrent(out / "model")  # the soup streams like any checkpoint
    y, _ = rec.chunk(torch.tensor([[72, 105]]), rec.init_state(1))
    assert y.shape == (1, 2, soup.config.out_dim)


def test_soup_of_the_runs_last_steps_with_their_start(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "soup_last"
    argv = [str(runs["ft_a"]), "--with-start", "--checkpoint", "last", "--out", str(out)]
    assert soup_main(argv) is None
    last = load_checkpoint(runs["ft_a"] / "last").state_dict()
    start = load_checkpoint(runs["base"] / "model").state_dict()
    soup = load_checkpoint(out / "model").state_dict()
    for name, t in soup.items():
        assert torch.allclose(t, (last[name] + start[name]) / 2, atol=1e-6), name
    summary = json.loads((out / "summary.json").read_text())
    assert [i["checkpoint"] for i in summary["soup"]["ingredients"]] == ["last"]
    with pytest.raises(SoupError, match="unknown checkpoint"):
        read_ingredient(runs["ft_a"], "best")


@pytest.mark.parametrize(
    ("which", "message"),
    [
        (["ft_a"], "at least 2 run(s)"),
        (["ft_a", "other"], "trained from scratch"),
        (["base", "ft_a"], "trained from scratch"),
        (["ft_a", "missing"], "no summary.json"),
    ],
)
def test_runs_that_cannot_be_averaged_are_refused(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture, which, message
) -> None:
    paths = [str(runs.get(w, tmp_path / w)) for w in which]
    with pytest.raises(SystemExit) as err:
        soup_main([*paths, "--out", str(tmp_path / "soup")])
    assert err.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "soup").exists()  # nothing written


def test_a_damaged_summary_is_refused(runs: dict[str, Path], tmp_path: Path, capsys) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(runs["ft_b"], broken)
    (broken / "summary.json").write_text('{"steps": 4')  # cut short
    with pytest.raises(SystemExit) as err:
        soup_main([str(runs["ft_a"]), str(broken), "--out", str(tmp_path / "soup")])
    assert err.value.code == 2 and "summary.json is not valid JSON" in capsys.readouterr().err
    (broken / "summary.json").write_text("[]")
    with pytest.raises(SoupError, match="not a dlr-train summary"):
        read_ingredient(broken)
    assert not (tmp_path / "soup").exists()


def test_fine_tunes_of_different_weights_are_refused(runs: dict[str, Path], tmp_path: Path):
    moved = tmp_path / "ft_c"
    argv = ["--init-from", str(runs["other"] / "model")]
    base = ["lm", "--text", str(runs["text"]), "--arch", "dlr", *TINY_LM, "--out-dir", str(moved)]
    assert train_main([*base, *argv]) == 0
    with pytest.raises(SoupError, match="fine-tunes of the same weights"):
        check_ingredients([read_ingredient(runs["ft_a"]), read_ingredient(moved)])


def test_with_start_averages_in_the_weights_the_runs_started_from(runs, tmp_path: Path) -> None:
    out = tmp_path / "soup"
    soup_main([str(runs["ft_a"]), str(runs["ft_b"]), "--with-start", "--out", str(out)])
    parts = [load_checkpoint(runs[r] / "model").state_dict() for r in ("ft_a", "ft_b", "base")]
    for name, t in load_checkpoint(out / "model").state_dict().items():
        assert torch.allclose(t, sum(p[name] for p in parts) / 3, atol=1e-6), name
    assert json.loads((out / "summary.json").read_text())["soup"]["with_start"] is True
    one = tmp_path / "one"  # one fine-tune and its start (a WiSE-FT midpoint)
    soup_main([str(runs["ft_a"]), "--with-start", "--out", str(one)])
    a, base = parts[0], parts[2]
    for name, t in load_checkpoint(one / "model").state_dict().items():
        assert torch.allclose(t, (a[name] + base[name]) / 2, atol=1e-6), name


def test_start_names_the_weights_of_runs_whose_init_paths_differ(runs, tmp_path: Path) -> None:
    """Fine-tunes of one model kept at two paths (e.g. a shipped model later replaced, and its
    copy restored from git): refused as they are, averaged once --start names the weights."""
    copy = tmp_path / "base_copy"
    shutil.copytree(runs["base"] / "model", copy)
    moved = tmp_path / "ft_c"
    base = ["lm", "--text", str(runs["text"]), "--arch", "dlr", *TINY_LM, "--out-dir", str(moved)]
    assert train_main([*base, "--init-from", str(copy), "--lr", "0.005"]) == 0
    with pytest.raises(SoupError, match="fine-tunes of the same weights"):
        check_ingredients([read_ingredient(runs["ft_a"]), read_ingredient(moved)])
    out = tmp_path / "soup"
    argv = [str(runs["ft_a"]), str(moved), "--with-start", "--start", str(copy), "--out", str(out)]
    assert soup_main(argv) is None
    parts = [
        load_checkpoint(p).state_dict() for p in (runs["ft_a"] / "model", moved / "model", copy)
    ]
    for name, t in load_checkpoint(out / "model").state_dict().items():
        assert torch.allclose(t, sum(p[name] for p in parts) / 3, atol=1e-6), name
    soup = json.loads((out / "summary.json").read_text())["soup"]
    assert soup["init_from"] == str(copy)
    assert [i["init_from"] for i in soup["ingredients"]] == [str(runs["base"] / "model"), str(copy)]


def test_a_start_that_is_not_the_runs_checkpoint_is_refused(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """--start is checked whether or not it is averaged in: a missing path, or a checkpoint of
    another config, exits 2 with the reason and writes nothing."""
    argv = [str(runs["ft_a"]), str(runs["ft_b"]), "--out", str(tmp_path / "soup")]
    with pytest.raises(SystemExit) as err:
        soup_main([*argv, "--start", str(tmp_path / "missing")])
    assert err.value.code == 2 and "the runs' starting point" in capsys.readouterr().err
    other = tmp_path / "other_cfg"
    model = load_checkpoint(runs["base"] / "model")
    small = type(model.config).from_dict({**model.config.to_dict(), "d_state": 4})
    save_checkpoint(type(model)(small), other)
    with pytest.raises(SystemExit) as err:
        soup_main([*argv, "--with-start", "--start", str(other)])
    assert err.value.code == 2 and "not a training checkpoint of their config" in (
        capsys.readouterr().err
    )
    assert not (tmp_path / "soup").exists()
    assert soup_main([*argv, "--start", str(runs["base"] / "model")]) is None  # not averaged in
    a, b = (load_checkpoint(runs[r] / "model").state_dict() for r in ("ft_a", "ft_b"))
    for name, t in load_checkpoint(tmp_path / "soup" / "model").state_dict().items():
        assert torch.allclose(t, (a[name] + b[name]) / 2, atol=1e-6), name
