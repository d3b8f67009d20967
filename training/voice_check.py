"""How a speech model does on chosen voices of the corpus, train voices included: clean command
accuracy and unknown words accepted, per voice. Run it before training on new voices: voices
the model already gets right add little, voices it misses are new to it. `--missed N` lists,
per voice, what its missed commands were taken for (another command, or `_unknown_`).

    python -m training.voice_check models/speech-commands --engine kokoro --kokoro-accents
    python -m training.voice_check models/speech-commands --more-engines --engine flite --missed 5
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from dlr_runtime import load_checkpoint
from training.data.corpus import (
    CorpusConfig,
    accent_options,
    add_accent_args,
    all_tts_voices,
    engines_for,
    generate,
)
from training.data.rooms import rir_bank
from training.data.sc12 import SIL, UNK, WordPool, clip_windows
from training.eval_speech import clip_report, frame_scores


@dataclass
class VoiceCheck:
    per_voice: dict[str, dict]  # `clip_report`'s per-voice figures
    accepted: Counter[tuple[str, str]]  # (unknown word, command it was taken for) -> clips
    missed: Counter[tuple[str, str, str]]  # (voice, command, label it was taken for) -> clips


def check_voices(
    model_dir: str, cfg: CorpusConfig, engines: Sequence[str], cache_dir: str, workers: int = 1
) -> VoiceCheck:
    """The model on the clean clips of every voice of `engines` in `cfg`."""
    model = load_checkpoint(model_dir).eval()
    labels = list(model.config.labels)
    voices = [v for v in all_tts_voices(cfg) if v.engine in engines]
    clips = generate(cfg, cache_dir, workers, voices=voices)
    pool = WordPool.from_voices([clips[v.key] for v in voices])
    idx = np.arange(len(pool))
    with torch.no_grad():
        audio = clip_windows(pool, idx, rir_bank(cache_dir, seed=cfg.seed), 11, augment=False)
        pred = frame_scores(model, audio)[:, -1].argmax(-1).numpy()
    taken = (pool.labels == UNK) & (pred < SIL)
    accepted = Counter(
        zip(pool.words[taken].tolist(), [labels[i] for i in pred[taken]], strict=True)
    )
    miss = (pool.labels < SIL) & (pred != pool.labels)
    missed = Counter(
        zip(
            pool.voices[miss].tolist(),
            [labels[i] for i in pool.labels[miss]],
            [labels[i] for i in pred[miss]],
            strict=True,
        )
    )
    return VoiceCheck(
        clip_report(pred, pool.labels, pool.engines, pool.voices)["per_voice"], accepted, missed
    )


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model_dir")
    p.add_argument(
        "--engine",
        action="append",
        choices=engines_for(True),
        help="engines to score (default: all of the corpus)",
    )
    p.add_argument("--more-engines", action="store_true", help="the corpus with the engines")
    p.add_argument("--kokoro-extra", action="store_true", help="with the extra Kokoro mixes")
    p.add_argument("--kokoro-accents", action="store_true", help="with the accented Kokoro voices")
    add_accent_args(p)
    p.add_argument("--cache-dir", default="runs/sc12cache")
    p.add_argument("--workers", type=int, default=1, help="processes rendering missing clips")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--accepted", type=int, default=20, help="list the N most accepted unknowns")
    p.add_argument("--missed", type=int, default=0, help="per voice, its N commonest misses")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = CorpusConfig(
        engines=engines_for(args.more_engines),
        kokoro_extra=args.kokoro_extra,
        kokoro_accents=args.kokoro_accents,
        **accent_options(args),
    )
    engines = args.engine or list(cfg.engines)
    check = check_voices(args.model_dir, cfg, engines, args.cache_dir, args.workers)
    print(f"{'voice':44s} {'commands':>9s} {'unknown accepted':>17s}")
    for voice, r in check.per_voice.items():
        unk = r["unknown_accepted"]
        unk_s = "-" if unk is None else f"{100 * unk:.1f} %"
        print(f"{voice:44s} {100 * r['command_accuracy']:7.1f} % {unk_s:>17s}")
    if args.accepted:
        print(f"\nunknown words accepted most often (clips, over {len(check.per_voice)} voices):")
        for (word, command), n in check.accepted.most_common(args.accepted):
            print(f"  {word:>12s} -> {command:6s} {n}")
    if args.missed:
        print("\nmissed commands per voice (command -> taken for: clips):")
        for voice in check.per_voice:
            mine = Counter({k[1:]: n for k, n in check.missed.items() if k[0] == voice})
            shown = ", ".join(f"{c} -> {t}: {n}" for (c, t), n in mine.most_common(args.missed))
            print(f"  {voice:42s} {shown or '-'}")


if __name__ == "__main__":
    main()
