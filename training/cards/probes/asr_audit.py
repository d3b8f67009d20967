"""Probe (not part of the product): is the contrast between a near miss and its command in the
synthesized audio, or is it lost already in the data?

The speech model takes about a quarter of its own training voices' near misses ("app", "noun",
"stoop") for a command ("up", "down", "stop"). Either the synthesizers' clips of those words
sound like the command (then the labels are noise and no model can learn them), or the
contrast is there and the model misses it. An independent judge, trained on recorded human
speech, settles which: PocketSphinx's US English acoustic model (the `pocketsphinx` wheel,
which ships it; nothing is downloaded), forced to choose among the ten commands and the clip's
own word (a JSGF grammar of eleven words). Commands are judged among the ten commands alone, as
a check that the judge can hear these voices at all. Each clip is judged once, from the
model's initial cepstral mean, so the order of the clips does not matter.

For each clip (the evaluation's clean clip windows, `sc12.clip_windows`, the same sample as
`split_gap.py`): the judge's word, and the model's last-frame argmax. The table gives, per
engine, the share of near-miss clips the judge hears as their own word, and the share of those
that the model takes for a command.

    pip install -e '.[probes]'   # pocketsphinx (not needed by the product or its tests)
    PYTHONPATH=. python training/cards/probes/asr_audit.py runs/m15_soup4/model \\
        --rhvoice-accents [--splits train test] [--max-clips 8000]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import numpy as np
from pocketsphinx import Decoder

from training.cards.probes.split_gap import clip_args, clip_setup
from training.data.labels import SC10_LABELS
from training.data.sc12 import SIL, UNK, clip_windows
from training.data.vocab import NEAR_MISSES
from training.eval_speech import CLIP_SEED, clip_sample, frame_scores

PAD = np.zeros(4800, np.int16)  # 0.3 s of silence on each side for the judge


def grammar(words: list[str]) -> str:
    return "#JSGF V1.0;\ngrammar g;\npublic <s> = " + " | ".join(words) + " ;\n"


class Judge:
    """PocketSphinx forced to pick one word of a small grammar."""

    def __init__(self) -> None:
        self.dec = Decoder(lm=None, loglevel="FATAL")
        self.searches: set[str] = set()
        self.cmn = self.dec.get_cmn()  # every clip starts from it: no drift from clip to clip

    def pick(self, audio: np.ndarray, words: list[str]) -> str:
        name = "_".join(words)[:200]
        if name not in self.searches:
            self.dec.add_jsgf_string(name, grammar(words))
            self.searches.add(name)
        self.dec.activate_search(name)
        pcm = np.concatenate([PAD, audio, PAD]).astype(np.int16)
        self.dec.set_cmn(self.cmn)
        self.dec.start_utt()
        self.dec.process_raw(pcm.tobytes(), full_utt=True)
        self.dec.end_utt()
        hyp = self.dec.hyp()
        return hyp.hypstr.strip() if hyp is not None else ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    clip_args(ap, 8000, ["train"])
    ap.add_argument("--json", default="", help="write the figures here too")
    a = ap.parse_args()
    model, pools, rirs = clip_setup(a)
    judge = Judge()
    commands = list(SC10_LABELS)
    near = set(NEAR_MISSES)
    out: dict[str, dict] = {}
    for name in a.splits:
        pool = pools[name]
        idx = clip_sample(len(pool), a.max_clips, a.seed, salt=0x5A9)
        lab = pool.labels[idx]
        keep = (lab < SIL) | ((lab == UNK) & np.isin(pool.words[idx], list(near)))
        idx, lab = idx[keep], lab[keep]
        audio = clip_windows(pool, idx, rirs, a.seed + CLIP_SEED, augment=False)
        pred = frame_scores(model, audio)[:, -1].argmax(-1).numpy()
        counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for k, i in enumerate(idx):
            word, engine = str(pool.words[i]), str(pool.engines[i])
            pcm = np.clip(audio[k].numpy() * 32768, -32768, 32767).astype(np.int16)
            heard = judge.pick(pcm, commands if lab[k] < SIL else [word, *commands])
            for group in (engine, "all"):
                c = counts[group]
                if lab[k] < SIL:
                    c["commands"] += 1
                    c["commands_judge_right"] += heard == word
                    c["commands_model_right"] += int(pred[k]) == int(lab[k])
                else:
                    c["near"] += 1
                    c["near_judge_own_word"] += heard == word
                    c["near_model_accepts"] += int(pred[k]) < SIL
                    if heard == word:
                        c["near_heard_own_model_accepts"] += int(pred[k]) < SIL
        rows = {}
        print(f"\n{name}: clean clips; judge = PocketSphinx en-us, forced choice")
        print(
            "| engine | commands: judge / model right | near misses | judge hears the word "
            "itself | model takes it for a command | ... of those the judge hears as the word |"
        )
        print("|---|---:|---:|---:|---:|---:|")
        for group in sorted(counts, key=lambda g: (g == "all", g)):
            c = counts[group]
            own = c["near_judge_own_word"]
            row = {
                "commands": c["commands"],
                "commands_judge_right": c["commands_judge_right"] / max(1, c["commands"]),
                "commands_model_right": c["commands_model_right"] / max(1, c["commands"]),
                "near_misses": c["near"],
                "near_judge_own_word": own / max(1, c["near"]),
                "near_model_accepts": c["near_model_accepts"] / max(1, c["near"]),
                "near_heard_own_model_accepts": c["near_heard_own_model_accepts"] / max(1, own),
            }
            rows[group] = row
            print(
                f"| {group} | {100 * row['commands_judge_right']:.1f} / "
                f"{100 * row['commands_model_right']:.1f} % | {c['near']} | "
                f"{100 * row['near_judge_own_word']:.1f} % | "
                f"{100 * row['near_model_accepts']:.1f} % | "
                f"{100 * row['near_heard_own_model_accepts']:.1f} % |"
            )
        out[name] = rows
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
