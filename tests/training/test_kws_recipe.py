"""A tiny end-to-end keyword-spotting run through the real command line, resumed, then evaluated."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from dlr_runtime import DLRModel, load_checkpoint, load_recurrent
from dlr_runtime.kws import KWSConfig
from dlr_runtime.pcen import INIT_ALPHA, INIT_DELTA, INIT_R
from training.cli import main
from training.data.rooms import rir_bank
from training.data.sc12 import SIL, UNK
from training.data.vocab import SC12_LABELS, unknown_words
from training.eval_cli import main as eval_main
from training.eval_speech import DET_TARGETS, EvalOptions, scoring_pools, split_streams
from training.kws_calibrate import main as calibrate_main
from training.kws_card import main as card_main
from training.kws_card_refresh import main as refresh_main
from training.kws_folds import loso_records, route
from training.recipes.kws import KWSOptions
from training.soup import main as soup_main
from training.split_unknown import main as split_main
from training.widen_frontend import main as widen_main

from .conftest import QUIET, TINY_MODEL

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("espeak-ng") is None or shutil.which("flite") is None,
        reason="needs espeak-ng and flite",
    ),
]


def global_point_of(curve: list[dict], fa_target: float) -> dict:
    """The operating-point rule on a stored curve: the lowest threshold within the target
    (the highest when none is)."""
    ok = [p for p in curve if p["fa_per_hour"] <= fa_target]
    return min(ok, key=lambda p: p["threshold"]) if ok else max(curve, key=lambda p: p["threshold"])


def quick_eval(model: Path, cache: Path, clips: int, silence: int) -> int:
    """`dlr-eval speech` on a few clips and half a minute of streams (two pieces each, so the
    recall gets its intervals), writing the point."""
    return eval_main(
        ["speech", str(model), "--cache-dir", str(cache), "--max-clips", str(clips),
         "--silence-clips", str(silence), "--stream-minutes", "0.5", "--valid-stream-minutes",
         "0.5", "--stream-piece-minutes", "0.25", "--write-operating-point"]
    )  # fmt: skip


def test_kws_train_resume_and_eval(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "kws"
    argv = [
        "kws", "--out-dir", str(out), "--cache-dir", str(tmp_path / "cache"), "--tiny-corpus",
        "--batch-size", "4", "--epoch-windows", "8", "--valid-clips", "24", "--valid-silence", "4",
        "--warmup", "1", "--num-workers", "0", "--workers", "1", "--save-every", "1",
        *TINY_MODEL, *QUIET,
    ]  # fmt: skip
    assert main([*argv, "--steps", "2"]) == 0
    assert main([*argv, "--steps", "4", "--resume"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["sizes"]["train"]["clips"] > 0
    assert (out / "curves.png").is_file()
    for key in ("accuracy", "command_accuracy", "false_accept"):  # also after 60 s of stream
        assert 0.0 <= summary["valid"][f"context_{key}"] <= 1.0
    split = summary["split"]
    assert not set(split["train"]) & (set(split["valid"]) | set(split["test"]))
    for form in ("complex64", "complex128"):
        assert summary["streaming"][form]["final_prediction_agreement"] == 1.0
    model = load_checkpoint(out / "model")
    cfg = model.config
    assert cfg.labels == list(SC12_LABELS) and cfg.frontend == "logmel" and cfg.pool_window_s > 0
    assert KWSConfig.from_metadata(model.checkpoint_metadata) == KWSConfig()
    rec = load_recurrent(out / "model")
    y, _ = rec.chunk(torch.zeros(1, 16000), rec.init_state(1))
    assert y.shape == (1, 16000 // cfg.frame_stride, len(SC12_LABELS))
    assert quick_eval(out / "model", tmp_path / "cache", clips=20, silence=8) == 0
    res = json.loads((out / "model" / "eval" / "eval.json").read_text())
    assert {"clean", "augmented", "silence", "streams", "confusion"} <= set(res)
    assert {"unknown_accepted_near_miss", "unknown_accepted_other_word"} <= set(res["clean"])
    assert len(res["augmented"]["rejection_sweep"]) > 1
    assert (out / "model" / "eval" / "rejection.png").is_file()
    assert set(res["clean"]["per_engine"]) <= {"espeak", "flite"}
    assert (out / "model" / "eval" / "confusion.png").is_file()
    assert (out / "model" / "eval" / "det.png").is_file()
    point = load_checkpoint(out / "model").checkpoint_metadata["detection"]
    assert point == res["streams"]["operating_point"]
    assert res["streams"]["rule"] == "global" and point["keywords"] == {}
    # the probes' and benchmarks' rebuild of the evaluation's streams is the evaluation's own
    cache = tmp_path / "cache"
    seed = res["seed"]
    kws_opts = model.checkpoint_metadata["training"]["recipe_options"]["kws"]
    pools = scoring_pools(kws_opts, res["split"], seed, EvalOptions(cache_dir=str(cache)))
    for name in ("valid", "test"):
        rebuilt = split_streams(pools, name, 0.5, rir_bank(cache, seed=seed), seed, 0.25)
        n = sum(e.label < SIL for s in rebuilt for e in s.events)
        assert len(rebuilt) == 2
        assert n == res["streams"][f"{name}_at_operating_point"]["commands"] > 0
        assert sum(s.hours for s in rebuilt) == res["streams"][name]["hours"]
        # each target's recall is the curve's at that target, inside its interval
        ivs = res["streams"][name]["intervals"]
        assert ivs["pieces"] == 2
        assert [iv["fa_target"] for iv in ivs["within"]] == list(DET_TARGETS)
        for iv in ivs["within"]:
            at = global_point_of(res["streams"][name]["curve"], iv["fa_target"])
            assert iv["recall"] == pytest.approx(at["recall"])
            assert iv["low"] <= iv["recall"] <= iv["high"]
        at, at_iv = res["streams"][f"{name}_at_operating_point"], ivs["at_operating_point"]
        assert at_iv["recall"]["value"] == pytest.approx(at["recall"])
        assert at_iv["fa_per_hour"]["value"] == pytest.approx(at["fa_per_hour"])
    with pytest.raises(ValueError, match="streams are built for"):
        split_streams(pools, "train", 0.5, [], 0)
    # overlapping 40 ms windows, fine-tuned from the per-frame weights (same shapes): the
    # streamed recurrent form (history in the state) agrees with the offline forward
    win = tmp_path / "kws-window"
    argv_win = [a if a != str(out) else str(win) for a in argv]
    # (with SpecAugment masks: training only, the exported model is the same network; and with
    # causal feature normalisation, whose state the streamed form carries too)
    assert main([*argv_win, "--steps", "2", "--frame-window", "640", "--init-from",
                 str(out / "model"), "--freq-masks", "2", "--time-masks", "2",
                 "--feature-norm-s", "0.5"]) == 0  # fmt: skip
    summary = json.loads((win / "summary.json").read_text())
    for form in ("complex64", "complex128"):
        assert summary["streaming"][form]["final_prediction_agreement"] == 1.0
        assert summary["streaming"][form]["max_abs_score_diff"] < 1e-4
    rec = load_recurrent(win / "model")
    assert (rec.config.window, rec.config.history) == (640, 320)
    assert rec.init_state(1)["frame_hist"].shape == (1, 320)
    assert rec.config.feature_norm_s == 0.5 and rec.init_state(1)["feat_sum"].shape == (1, 40)
    # the dictionary's near misses (a training-only layer of the training voices)
    xn = tmp_path / "kws-extra"
    argv_xn = [a if a != str(out) else str(xn) for a in argv]
    assert main([*argv_xn, "--steps", "2", "--extra-near-misses"]) == 0
    sizes = json.loads((xn / "summary.json").read_text())["sizes"]
    plain = json.loads((out / "summary.json").read_text())["sizes"]
    assert sizes["train"]["unknown"] > plain["train"]["unknown"]
    assert sizes["valid"] == plain["valid"] and sizes["test"] == plain["test"]
    # the PCEN front end (warped per window while training, as log-mel): its per-band
    # parameters are learnt and saved, and the streamed form carries its smoother's state
    pc = tmp_path / "kws-pcen"
    argv_pc = [a if a != str(out) else str(pc) for a in argv]
    assert main([*argv_pc, "--steps", "2", "--frontend", "pcen"]) == 0
    summary = json.loads((pc / "summary.json").read_text())
    for form in ("complex64", "complex128"):
        assert summary["streaming"][form]["final_prediction_agreement"] == 1.0
    pcen_model = load_checkpoint(pc / "model")
    assert pcen_model.config.frontend == "pcen"
    assert not torch.equal(pcen_model.encoder.pcen.log_r, torch.full((40,), math.log(0.5)))
    assert load_recurrent(pc / "model").init_state(1)["pcen_sum"].shape == (1, 40)
    # --pcen-fixed: the paper's fixed PCEN; the rest of the model still learns
    fx = tmp_path / "kws-pcen-fixed"
    argv_fx = [a if a != str(out) else str(fx) for a in argv]
    assert main([*argv_fx, "--steps", "2", "--frontend", "pcen", "--pcen-fixed"]) == 0
    fixed = load_checkpoint(fx / "model")
    assert torch.equal(fixed.encoder.pcen.log_alpha, torch.full((40,), math.log(INIT_ALPHA)))
    assert torch.equal(fixed.encoder.pcen.log_delta, torch.full((40,), math.log(INIT_DELTA)))
    assert torch.equal(fixed.encoder.pcen.log_r, torch.full((40,), math.log(INIT_R)))
    start = DLRModel(fixed.config, seed=0)  # the recipe's initialisation (seed 0)
    assert not torch.equal(fixed.encoder.frame.weight, start.encoder.frame.weight)
    # log-mel and PCEN side by side, fine-tuned from the log-mel model widened to it (the
    # PCEN half of the frame map at zero): the start scores as the log-mel model did
    wide = tmp_path / "kws-widened"
    assert widen_main([str(out / "model"), "--out", str(wide)]) == 0
    x = 0.1 * torch.randn(1, 16000, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(
            load_checkpoint(wide)(x), load_checkpoint(out / "model")(x), atol=1e-5
        )
    lp = tmp_path / "kws-logmel-pcen"
    argv_lp = [a if a != str(out) else str(lp) for a in argv]
    assert main([*argv_lp, "--steps", "2", "--frontend", "logmel_pcen", "--pcen-fixed",
                 "--init-from", str(wide)]) == 0  # fmt: skip
    summary = json.loads((lp / "summary.json").read_text())
    for form in ("complex64", "complex128"):
        assert summary["streaming"][form]["final_prediction_agreement"] == 1.0
    both = load_checkpoint(lp / "model")
    assert both.config.frontend == "logmel_pcen" and both.encoder.frame.in_features == 80
    assert both.encoder.frame.weight[:, 40:].any()  # the PCEN half learns from zero
    assert torch.equal(both.encoder.pcen.log_r, torch.full((40,), math.log(INIT_R)))
    assert main([*argv_win, "--steps", "1", "--pcen-fixed"]) == 2  # log-mel: nothing to fix
    assert "--pcen-fixed needs --frontend pcen" in capsys.readouterr().err
    assert main([*argv_win, "--steps", "1", "--frame-window", "100"]) == 2  # < frame stride
    assert "--frame-window must be 0 or >= --frame-stride" in capsys.readouterr().err
    assert main([*argv_win, "--steps", "1", "--freq-masks", "1", "--freq-mask-width", "41"]) == 2
    assert "exceeds the 40 mel bands" in capsys.readouterr().err
    # the domain-invariance penalty (training only): the checkpoint is the same network
    inv = tmp_path / "kws-invariance"
    argv_inv = [a if a != str(out) else str(inv) for a in argv]
    assert main([*argv_inv, "--steps", "2", "--invariance-weight", "0.5",
                 "--invariance-classwise"]) == 0  # fmt: skip
    summary = json.loads((inv / "summary.json").read_text())
    assert summary["invariance"]["domains"] == ["espeak", "flite"]
    assert 0.0 <= summary["valid"]["domain_share"] <= 1.0
    plain_keys = set(load_checkpoint(out / "model").state_dict())
    assert set(load_checkpoint(inv / "model").state_dict()) == plain_keys
    # the auxiliary phoneme loss (training only): its head resumes, the checkpoint is the same
    pho = tmp_path / "kws-phonemes"
    argv_pho = [a if a != str(out) else str(pho) for a in argv]
    assert main([*argv_pho, "--steps", "2", "--phoneme-loss-weight", "0.3"]) == 0
    assert (pho / "last" / "auxiliary.safetensors").is_file()
    assert main([*argv_pho, "--steps", "3", "--phoneme-loss-weight", "0.3", "--resume"]) == 0
    summary = json.loads((pho / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["phoneme_loss"]["weight"] == 0.3
    assert summary["phoneme_loss"]["block"] == 2  # the last of TINY_MODEL's two blocks
    assert summary["phoneme_loss"]["final"] > 0 and summary["valid"]["phoneme_loss"] > 0
    assert set(load_checkpoint(pho / "model").state_dict()) == plain_keys
    # each unknown word its own class, _unknown_ their union: fine-tuned from the model split
    # to it (the start scores as the model did), then scored by the evaluation as any model
    union = tmp_path / "kws-union"
    assert split_main([str(out / "model"), "--out", str(union), "--classes", "24"]) == 0
    with torch.no_grad():
        assert torch.allclose(
            load_checkpoint(union)(x), load_checkpoint(out / "model")(x), atol=1e-5
        )
    un = tmp_path / "kws-unknown-classes"
    argv_un = [a if a != str(out) else str(un) for a in argv]
    assert main([*argv_un, "--steps", "2", "--unknown-classes", "--init-from", str(union)]) == 0
    summary = json.loads((un / "summary.json").read_text())
    assert summary["unknown_classes"] == list(unknown_words()[:24])
    for form in ("complex64", "complex128"):
        assert summary["streaming"][form]["final_prediction_agreement"] == 1.0
    tuned = load_checkpoint(un / "model")
    assert tuned.config.unknown_classes == 24 and tuned.head.proj.weight.shape[0] == 11 + 24
    assert not torch.equal(tuned.head.proj.bias[11:], load_checkpoint(union).head.proj.bias[11:])
    assert quick_eval(un / "model", tmp_path / "cache", 16, 4) == 0
    assert main([*argv_un, "--steps", "1", "--unknown-classes"]) == 0  # from scratch too
    assert (
        main([*argv_un, "--steps", "1", "--unknown-classes", "--init-from", str(out / "model")])
        == 2
    )  # fmt: skip  (the plain head: split it first)
    capsys.readouterr()
    # one threshold per command: chosen on valid, compared with the shared one on test
    per = tmp_path / "per-command"
    rc = eval_main(
        ["speech", str(out / "model"), "--cache-dir", str(tmp_path / "cache"), "--max-clips", "8",
         "--silence-clips", "4", "--stream-minutes", "0.5", "--valid-stream-minutes", "0.5",
         "--stream-piece-minutes", "0.5", "--per-command", "--fa-target", "60", "--out", str(per),
         "--smooth-ms", "60", "200"]
    )  # fmt: skip
    assert rc == 0
    streams = json.loads((per / "eval.json").read_text())["streams"]
    assert streams["rule"] in ("global", "per_command")
    assert {"global_point", "per_command_curve", "test_per_command"} <= set(streams)
    assert set(streams["smoothing"]) == {"60", "200"}
    assert streams["operating_point"]["smooth_ms"] in (60.0, 200.0)
    n = sum(c["commands"] for c in streams["test_per_command"].values())
    assert n == streams["test_at_operating_point"]["commands"]
    # the mistakes at that point, by kind: every miss and every false accept is put somewhere
    at, anat = streams["test_at_operating_point"], streams["anatomy"]["test"]
    assert anat["commands"] == at["commands"]
    assert sum(anat["misses"].values()) == at["commands"] - round(at["recall"] * at["commands"])
    assert sum(anat["false_accepts"].values()) == at["false_accepts"]
    assert load_checkpoint(out / "model").checkpoint_metadata["detection"] == point  # untouched
    # the streams through the voice-activity gate, as the server's continuous mode runs them
    gated = tmp_path / "gated"
    rc = eval_main(
        ["speech", str(out / "model"), "--cache-dir", str(tmp_path / "cache"), "--max-clips", "8",
         "--silence-clips", "4", "--stream-minutes", "0.5", "--valid-stream-minutes", "0.5",
         "--stream-piece-minutes", "0.5", "--fa-target", "60", "--out", str(gated), "--vad"]
    )  # fmt: skip
    assert rc == 0
    g = json.loads((gated / "eval.json").read_text())["streams"]
    assert g["vad"] is True and streams["vad"] is False
    assert g["test"]["hours"] == streams["test"]["hours"]  # the same streams, gated

    # the card: the model, its evaluation and every command behind it, from the run's records
    notes, commands = tmp_path / "notes.md", tmp_path / "commands.txt"
    notes.write_text("- **What was tried.** Nothing yet.\n")
    commands.write_text("dlr-eval speech runs/x/model --stream-minutes 0   # one\nsecond line\n")
    card_main(
        [str(out), str(tmp_path / "card"), "--notes", str(notes), "--commands", str(commands)]
    )
    text = (tmp_path / "card" / "MODEL.md").read_text()
    assert "- **What was tried.** Nothing yet." in text
    # the stream figures with their intervals over the pieces (two per split here)
    assert "How sure these figures are" in text and "(2 valid and 2 test pieces" in text
    table = text.split("| voices | hours | commands | threshold |")[1].splitlines()
    test_row = next(r for r in table if r.startswith("| test | "))
    assert test_row.count("[") == 2  # recall and false accepts per hour
    block = text.split("## Commands")[1].split("```")[1].splitlines()
    assert block[3:5] == ["dlr-eval speech runs/x/model --stream-minutes 0   # one", "second line"]
    assert block[5].endswith(f"--notes {notes} --commands {commands}")
    assert load_checkpoint(tmp_path / "card").checkpoint_metadata["detection"] == point
    # training.kws_card_refresh without the run: the card kws_card writes from the new files
    notes.write_text("- **What was tried.** Something since.\n")
    commands.write_text("dlr-eval speech runs/y/model   # new\n")
    card_argv = [str(tmp_path / "card"), "--notes", str(notes), "--commands", str(commands)]
    assert refresh_main(card_argv) == 0
    refreshed = (tmp_path / "card" / "MODEL.md").read_text()
    assert "Something since." in refreshed and "Nothing yet." not in refreshed
    card_main([str(out), *card_argv])
    assert refreshed == (tmp_path / "card" / "MODEL.md").read_text()

    # --init-from: a fine-tuning run starts from the trained weights (a ~zero learning rate
    # keeps them), where a fresh run of the same seed does not
    tuned = tmp_path / "tuned"
    still = ["--steps", "1", "--lr", "1e-12", "--ssm-lr", "1e-12"]
    argv_t = [a if a != str(out) else str(tuned) for a in argv]
    assert main([*argv_t, *still, "--init-from", str(out / "model")]) == 0
    src = load_checkpoint(out / "model").state_dict()
    got = load_checkpoint(tuned / "model").state_dict()
    assert all(torch.allclose(src[k], got[k], atol=1e-6) for k in src)
    assert main([*argv_t, *still]) == 0
    fresh = load_checkpoint(tuned / "model").state_dict()
    assert not all(torch.allclose(src[k], fresh[k], atol=1e-6) for k in src)

    # a weight average of two fine-tunes (training.soup): the recipe's results recomputed on
    # it (streaming exactness included), and a card whose training section names the runs
    fts = [tmp_path / "ft1", tmp_path / "ft2"]
    for ft, extra in zip(fts, (["--morphs", "0"], ["--freq-masks", "1"]), strict=True):
        argv_ft = [a if a != str(out) else str(ft) for a in argv]
        assert main([*argv_ft, "--steps", "2", "--init-from", str(out / "model"), *extra]) == 0
    soup = tmp_path / "soup"
    soup_main([*map(str, fts), "--out", str(soup)])
    summary = json.loads((soup / "summary.json").read_text())
    for form in ("complex64", "complex128"):
        assert summary["streaming"][form]["final_prediction_agreement"] == 1.0
    assert summary["sizes"]["valid"]["clips"] > 0 and 0 <= summary["valid"]["accuracy"] <= 1
    assert quick_eval(soup / "model", tmp_path / "cache", clips=8, silence=4) == 0
    folds = tmp_path / "folds.json"
    card_main(
        [str(soup), str(tmp_path / "soup-card"), "--loso", str(out), "--save-loso", str(folds)]
    )
    text = (tmp_path / "soup-card" / "MODEL.md").read_text()
    assert "model soup" in text and "`ft1`" in text and "`ft2`" in text
    assert "SpecAugment (`training/spec_augment.py`) in 1 of the 2 runs averaged" in text
    # the fold table from its saved records equals the one from the run directories
    card_main([str(soup), str(tmp_path / "soup-card-2"), "--loso-table", str(folds)])
    text2 = (tmp_path / "soup-card-2" / "MODEL.md").read_text()

    def fold_table(t: str) -> str:
        return t.split("## Leave one synthesizer out")[1].split("## Continuous streams")[0]

    assert fold_table(text2) == fold_table(text) and "train without **final**" in text
    # a fold's training counts the runs it descends from: the two fine-tunes and their start
    (rec,) = loso_records([soup])
    assert rec.steps == 2 + 2 + 4 and [s["steps"] for s in route(soup)] == [4, 4]
    assert f"--loso-table {folds}" in text2
    # a fold scored at its last step: the record reads that checkpoint's evaluation
    assert quick_eval(out / "last", tmp_path / "cache", clips=8, silence=4) == 0
    (at_last,) = loso_records([out], "last")
    last_eval = json.loads((out / "last" / "eval" / "eval.json").read_text())
    assert at_last.clean_commands == last_eval["clean"]["command_accuracy"]
    card_main([str(soup), str(tmp_path / "soup-card-3"), "--loso", str(out),
               "--loso-checkpoint", "last"])  # fmt: skip
    assert "--loso-checkpoint last" in (tmp_path / "soup-card-3" / "MODEL.md").read_text()
    # an ingredient trained with the opt-in engines: the card's Data says so
    soup_summary = json.loads((soup / "summary.json").read_text())
    soup_summary["soup"]["ingredients"][0]["recipe_options"]["kws"]["more_engines"] = True
    (soup / "summary.json").write_text(json.dumps(soup_summary))
    card_main([str(soup), str(tmp_path / "soup-card-4")])
    text4 = (tmp_path / "soup-card-4" / "MODEL.md").read_text()
    assert (
        "Three more engines (`training/data/engines.py`, `--more-engines`, in 1 of the 2" in text4
    )
    assert "`rh-evgeniy` and `rh-lyubov` are test-only" in text4
    assert "--workers 2 --more-engines" in text4 and "--workers 2 --more-engines" not in text
    assert "Three more engines" not in text

    # rejection calibration of the average: the chosen bias is on the _unknown_ logit only,
    # the recipe's results (streaming exactness included) are the calibrated model's
    cal = tmp_path / "soup-cal"
    calibrate_main([str(soup), "--false-accept", "0.5", "--out", str(cal)])
    summary = json.loads((cal / "summary.json").read_text())
    chosen = summary["calibration"]["chosen"]
    assert chosen["false_accept"] <= 0.5 and summary["command"].endswith(f"--out {cal}")
    assert (cal / "calibration.png").read_bytes()[:4] == b"\x89PNG"
    for form in ("complex64", "complex128"):
        assert summary["streaming"][form]["final_prediction_agreement"] == 1.0
    src = load_checkpoint(soup / "model").state_dict()
    got = load_checkpoint(cal / "model").state_dict()
    bias = got["head.proj.bias"] - src["head.proj.bias"]
    assert torch.allclose(bias[UNK], torch.tensor(chosen["unknown_bias"]), atol=1e-6)
    assert torch.equal(bias[:UNK], torch.zeros(UNK))
    assert all(torch.equal(src[k], got[k]) for k in src if k != "head.proj.bias")
    with pytest.raises(SystemExit):
        calibrate_main([str(soup), "--false-accept", "1.5", "--out", str(tmp_path / "x")])


def test_scoring_pools_follow_the_models_corpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pools a model is scored on (dlr-eval speech, bench_kws_gate) are the corpus its
    metadata names: a model trained with the three opt-in engines is scored with their test
    voices, whoever rebuilds its streams."""
    import training.eval_speech as eval_speech

    seen: list[KWSOptions] = []
    monkeypatch.setattr(eval_speech, "load_split", lambda opts, seed: seen.append(opts) or {})
    opts = EvalOptions(cache_dir="c", rhvoice_accents=True)
    eval_speech.scoring_pools({"more_engines": True}, "final", 3, opts)
    eval_speech.scoring_pools({"tiny_corpus": True}, "loso-flite", 3, EvalOptions())
    assert (seen[0].more_engines, seen[0].rhvoice_accents, seen[0].cache_dir) == (True, True, "c")
    assert (seen[1].more_engines, seen[1].tiny_corpus, seen[1].split) == (False, True, "loso-flite")
