"""Training routes (`training.route`): a base run, fine-tunes of it side by side, their average.

A tiny LM route runs end to end as subprocesses: the fine-tunes start from the base run's
model, the soup is the mean of their weight averages and the base, a second invocation skips
what is done and reruns what is missing, and a failing stage stops the route with its name.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import pytest
import torch

from dlr_runtime import load_checkpoint
from training.route import RouteError, load_route
from training.route import main as route_main

from .conftest import TINY_LM, write_corpus

ROUTE_FILES = Path(__file__).resolve().parents[2] / "training" / "routes"


def _route_file(path: Path, text_dir: Path, tunes: dict[str, str]) -> Path:
    common = shlex.join(["--text", str(text_dir), "--arch", "dlr", *TINY_LM])
    lines = [
        'recipe = "lm"',
        f"common = {json.dumps(common)}",
        'fine_tune_common = "--ema-decay 0.9"',
        "parallel = 2",
        "[fine_tunes]",
        *(f"{name} = {json.dumps(args)}" for name, args in tunes.items()),
        "[soup]",
        'checkpoint = "ema"',
        "with_start = true",
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _weights(model_dir: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(model_dir).state_dict()


@pytest.mark.slow
def test_a_route_runs_resumes_and_averages_the_fine_tunes_with_their_base(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    text = write_corpus(tmp_path / "corpus")
    route = _route_file(tmp_path / "r.toml", text, {"a": "--lr 0.01", "b": "--lr 0.003"})
    out = tmp_path / "route"
    assert route_main([str(route), "--out-dir", str(out)]) == 0
    report = json.loads((out / "route.json").read_text())
    assert [(s["name"], s["state"]) for s in report["stages"]] == [
        ("base", "done"),
        ("a", "done"),
        ("b", "done"),
        ("soup", "done"),
    ]
    assert report["minutes"] == pytest.approx(sum(report["phase_minutes"].values()), abs=0.02)
    for name in ("a", "b"):  # each fine-tune started from the base run's kept model
        summary = json.loads((out / name / "summary.json").read_text())
        assert f"--init-from {out / 'base' / 'model'}" in summary["command"]
    members = [_weights(out / "a" / "ema"), _weights(out / "b" / "ema")]
    members.append(_weights(out / "base" / "model"))
    soup = _weights(out / "soup" / "model")
    for key, value in soup.items():
        if value.is_floating_point():
            mean = sum(m[key].double() for m in members) / 3
            torch.testing.assert_close(value.double(), mean, rtol=0, atol=1e-6)

    # A second invocation skips every stage; with the soup gone, it makes only the soup again.
    stamp = (out / "a" / "summary.json").stat().st_mtime_ns
    assert route_main([str(route), "--out-dir", str(out)]) == 0
    again = json.loads((out / "route.json").read_text())
    assert {s["state"] for s in again["stages"]} == {"skipped"}
    assert again["minutes"] == report["minutes"]
    shutil.rmtree(out / "soup")
    assert route_main([str(route), "--out-dir", str(out)]) == 0
    third = json.loads((out / "route.json").read_text())
    assert [s["state"] for s in third["stages"]] == ["skipped", "skipped", "skipped", "done"]
    assert (out / "a" / "summary.json").stat().st_mtime_ns == stamp
    for key, value in _weights(out / "soup" / "model").items():
        assert torch.equal(value, soup[key])

    # The route file edited after its stages ran: refused in the same output directory.
    _route_file(route, text, {"a": "--lr 0.02", "b": "--lr 0.003"})
    capsys.readouterr()
    assert route_main([str(route), "--out-dir", str(out)]) == 2
    assert "stage a in" in capsys.readouterr().err
    assert (out / "a" / "summary.json").stat().st_mtime_ns == stamp

    # A fine-tune that fails stops the route, naming the stage and its log; no soup is made.
    bad = _route_file(tmp_path / "bad.toml", text, {"ok": "--lr 0.01", "broken": "--no-such"})
    capsys.readouterr()
    assert route_main([str(bad), "--out-dir", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert "stage broken failed" in err and str(tmp_path / "bad" / "broken.log") in err
    assert not (tmp_path / "bad" / "soup").exists()
    states = {
        s["name"]: s["state"]
        for s in json.loads((tmp_path / "bad/route.json").read_text())["stages"]
    }
    assert states == {"base": "done", "ok": "done", "broken": "failed", "soup": "pending"}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('common = "--x"\n[fine_tunes]\na = "--lr 1"\n', "`recipe`"),
        ('recipe = "lm"\n', "at least one fine-tune"),
        ('recipe = "lm"\nbase = "--out-dir x"\n[fine_tunes]\na = ""\n', "set by the route"),
        ('recipe = "lm"\n[fine_tunes]\na = "--init-from=x"\n', "set by the route"),
        ('recipe = "lm"\n[fine_tunes]\nsoup = ""\n', "cannot be named"),
        ('recipe = "lm"\nparallel = 0\n[fine_tunes]\na = ""\n', "`parallel`"),
        ('recipe = "lm"\nstages = 3\n[fine_tunes]\na = ""\n', "unknown fields ['stages']"),
        ('recipe = "lm"\n[fine_tunes]\na = ""\n[soup]\ncheckpoint = "best"\n', "soup.checkpoint"),
        ('recipe = "lm"\ncommon = 3\n[fine_tunes]\na = ""\n', "common: expected"),
        ("recipe = \n", "r.toml"),
        ('recipe = "lm"\nsoup = 3\n[fine_tunes]\na = ""\n', "`[soup]` takes"),
        ('recipe = "lm"\n[fine_tunes]\na = ""\n[soup]\nwith_start = "yes"\n', "with_start"),
        ('recipe = "lm"\n[fine_tunes]\na = ""\n[soup]\nstart = true\n', "`[soup]` takes"),
    ],
)
def test_route_files_that_cannot_run_are_refused(tmp_path: Path, body: str, message: str):
    path = tmp_path / "r.toml"
    path.write_text(body)
    with pytest.raises(RouteError, match=re.escape(message)):
        load_route(path)


def test_the_shipped_route_file_loads_and_names_its_stages(capsys: pytest.CaptureFixture):
    route = load_route(ROUTE_FILES / "speech-commands.toml")
    assert route.recipe == "kws" and list(route.fine_tunes) == ["morphs", "engines_balanced"]
    assert route.soup.checkpoint == "ema" and route.soup.with_start
    assert (
        route_main([str(ROUTE_FILES / "speech-commands.toml"), "--out-dir", "x", "--dry-run"]) == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["base", "morphs", "engines_balanced", "soup"]
    assert "--init-from x/base/model" in lines[1] and lines[3].endswith(
        "x/morphs x/engines_balanced"
    )


def test_the_pcen_route_differs_from_the_shipped_one_by_its_front_end_only():
    shipped = load_route(ROUTE_FILES / "speech-commands.toml")
    pcen = load_route(ROUTE_FILES / "speech-commands-pcen.toml")
    out = Path("x")
    for stage in ("base_args", "soup_args"):
        a, b = getattr(shipped, stage)(out), getattr(pcen, stage)(out)
        assert [w for w in b if w not in ("--frontend", "pcen")] == a
    for name in shipped.fine_tunes:
        a, b = shipped.fine_tune_args(out, name), pcen.fine_tune_args(out, name)
        assert b.count("pcen") == 1 and [w for w in b if w not in ("--frontend", "pcen")] == a


def test_the_fixed_pcen_route_differs_from_the_pcen_one_by_the_fixed_flag_only():
    learnt = load_route(ROUTE_FILES / "speech-commands-pcen.toml")
    fixed = load_route(ROUTE_FILES / "speech-commands-pcen-fixed.toml")
    out = Path("x")
    stages = [("base_args", ()), ("soup_args", ())]
    stages += [("fine_tune_args", (name,)) for name in learnt.fine_tunes]
    for stage, name in stages:
        a, b = getattr(learnt, stage)(out, *name), getattr(fixed, stage)(out, *name)
        assert b.count("--pcen-fixed") == a.count("pcen")  # once per training stage, not the soup
        assert [w for w in b if w != "--pcen-fixed"] == a


@pytest.mark.parametrize("path", sorted(ROUTE_FILES.glob("*.toml")), ids=lambda p: p.stem)
def test_every_route_files_training_stages_parse_as_dlr_train_commands(path: Path):
    from training.cli import parse

    route = load_route(path)
    out = Path("x")
    stages = [route.base_args(out)] + [route.fine_tune_args(out, n) for n in route.fine_tunes]
    for argv in stages:
        args = parse(argv)  # exits 2 on an unknown or malformed flag
        assert args.recipe == route.recipe


def test_the_accents_route_fine_tunes_the_shipped_averages_four_ingredients():
    """The shipped model (the fifteenth session's average) is the start averaged with four
    3,000-step fine-tunes with the accented voices: plain, SpecAugment, engines drawn evenly,
    near misses half the time. The accents route makes the same four from its own base."""
    from training.cli import parse

    route = load_route(ROUTE_FILES / "speech-commands-accents.toml")
    assert list(route.fine_tunes) == ["plain", "spec_augment", "engines_balanced", "near_misses"]
    assert route.soup.checkpoint == "ema" and route.soup.with_start
    base = parse(route.base_args(Path("x")))
    assert base.options.rhvoice_accents and base.options.more_engines and base.options.codecs
    tunes = {n: parse(route.fine_tune_args(Path("x"), n)) for n in route.fine_tunes}
    assert {n: a.train.steps for n, a in tunes.items()} == dict.fromkeys(tunes, 3000)
    assert tunes["spec_augment"].options.freq_masks == 2
    assert tunes["engines_balanced"].options.balance_engines
    assert tunes["near_misses"].options.p_near_miss == 0.5
    assert tunes["plain"].options.p_near_miss == 0.0
