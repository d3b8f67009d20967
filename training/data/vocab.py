"""The SC12 label set and the word lists behind ``_unknown_``.

SC12 (Speech Commands v2 style) = the ten commands + ``_silence_`` + ``_unknown_``. ``_unknown_``
is every other English word: :data:`NEAR_MISSES` (words one sound away from a command, the ones a
keyword spotter confuses first) and :data:`OTHER_WORDS` (ordinary words of several syllable
shapes). Homophones of a command (``know``, ``write``, ...) are never used as unknown words: a
listener cannot tell them apart, so labelling them ``_unknown_`` would be label noise;
:data:`HOMOPHONES` lists them and :func:`check_vocabulary` enforces it.
"""

from __future__ import annotations

from training.data.labels import SC10_LABELS

SILENCE = "_silence_"
UNKNOWN = "_unknown_"

#: Label order of every SC12 model: the ten commands, then silence, then unknown.
SC12_LABELS: tuple[str, ...] = (*SC10_LABELS, SILENCE, UNKNOWN)

#: Words that sound like a command; never used as ``_unknown_``.
HOMOPHONES: frozenset[str] = frozenset(
    {"know", "noh", "write", "rite", "wright", "wrights", "yess", "goe", "off.", "stopp"}
)

#: The words one sound away from each command (onset, vowel or coda changed): the near misses a
#: keyword spotter confuses with that command first ("dawn" and "of" are near two commands).
NEAR_MISSES_OF: dict[str, tuple[str, ...]] = {
    "yes": (
        "yet", "yell", "mess", "less", "guess", "chess", "yeah", "yen", "dress", "press",
    ),
    "no": (
        "now", "new", "snow", "show", "so", "toe", "low", "nose", "note", "nine", "gnaw", "knee",
    ),
    "up": (
        "cup", "pup", "app", "ape", "hop", "us", "ugh", "sup", "upon", "pop",
    ),
    "down": (
        "dawn", "town", "brown", "crown", "done", "dune", "gown", "drown", "noun", "den",
    ),
    "left": (
        "lift", "loft", "laughed", "theft", "lest", "deft", "lefty", "lap", "lend", "lent",
    ),
    "right": (
        "bright", "light", "night", "white", "bite", "ride", "rye", "wrong", "ripe", "fright",
        "kite", "height",
    ),
    "on": (
        "of", "an", "in", "odd", "own", "dawn", "gone", "con", "don", "honor",
    ),
    "off": (
        "of", "oft", "cough", "scoff", "awe", "if", "often", "doff", "tough", "huff",
    ),
    "stop": (
        "top", "shop", "stock", "step", "stub", "stomp", "spot", "stab", "drop", "stoop", "dot",
        "stopped",
    ),
    "go": (
        "goat", "goal", "gold", "grow", "ghost", "dough", "bow", "row", "code", "coat", "glow",
        "goo",
    ),
}  # fmt: skip

#: Every near miss, command by command (a word near two commands appears twice).
NEAR_MISSES: tuple[str, ...] = tuple(w for ws in NEAR_MISSES_OF.values() for w in ws)

#: Ordinary English words of several syllable shapes (none of them a command).
OTHER_WORDS: tuple[str, ...] = (
    "bed", "bird", "cat", "dog", "house", "tree", "wow", "happy", "marvin", "sheila",
    "zero", "one", "three", "four", "five", "six", "seven", "eight", "ten", "forward",
    "backward", "follow", "learn", "visual", "table", "window", "water", "music", "light",
    "paper", "pencil", "garden", "market", "doctor", "kitchen", "minute", "second", "hour",
    "morning", "evening", "yesterday", "tomorrow", "today", "weather", "summer", "winter",
    "apple", "banana", "orange", "lemon", "carrot", "potato", "tomato", "bread", "cheese",
    "butter", "coffee", "sugar", "salt", "pepper", "chicken", "fish", "horse", "mouse",
    "rabbit", "monkey", "tiger", "lion", "zebra", "whale", "shark", "snake", "spider",
    "bottle", "basket", "bucket", "candle", "chair", "couch", "door", "floor", "roof",
    "wall", "street", "road", "bridge", "river", "ocean", "mountain", "valley", "forest",
    "desert", "island", "city", "village", "country", "planet", "rocket", "engine",
    "machine", "computer", "phone", "camera", "radio", "picture", "story", "letter",
    "number", "answer", "question", "problem", "idea", "reason", "moment", "family",
    "mother", "father", "sister", "brother", "daughter", "baby", "people", "person",
    "teacher", "student", "friend", "neighbor", "captain", "pilot", "farmer", "singer",
    "player", "winner", "money", "dollar", "penny", "ticket", "station", "airport",
    "hotel", "office", "school", "library", "museum", "hospital", "church", "castle",
    "palace", "tower", "garage", "basement", "attic", "bathroom", "bedroom", "blanket",
    "pillow", "jacket", "shirt", "shoe", "sock", "glove", "hat", "scarf", "umbrella",
    "purple", "yellow", "green", "blue", "black", "silver", "golden", "simple", "quiet",
    "loud", "quick", "slow", "heavy", "empty", "full", "young", "old", "early", "late",
    "always", "never", "maybe", "please", "thanks", "hello", "goodbye", "sorry", "welcome",
    "open", "close", "start", "begin", "finish", "pause", "play", "jump", "run", "walk",
    "sit", "stand", "sleep", "wake", "eat", "drink", "read", "sing", "dance", "swim",
    "climb", "throw", "catch", "push", "pull", "turn", "move", "carry", "bring", "send",
    "find", "keep", "give", "take", "make", "build", "break", "fix", "clean", "wash",
    "cook", "bake", "paint", "draw", "count", "listen", "watch", "look", "see", "hear",
    "feel", "think", "remember", "forget", "believe", "wonder", "hope", "wish", "want",
    "need", "like", "love", "hate", "enjoy", "help", "call", "ask", "tell", "say",
    "speak", "talk", "laugh", "cry", "smile", "shout", "whisper", "nothing", "something",
    "everything", "anything", "somebody", "nobody", "everybody", "together", "inside",
    "outside", "above", "below", "behind", "between", "around", "under", "over", "through",
    "across", "along", "against", "toward", "without", "within", "because", "although",
    "unless", "until", "while", "where", "when", "what", "which", "who", "why", "how",
    "the", "and", "but", "with", "from", "for", "this", "that", "these", "those", "there",
    "here", "very", "much", "many", "some", "any", "every", "each", "other", "another",
    "elephant", "umbrella", "banana", "potato", "animal", "beautiful", "wonderful",
    "difficult", "important", "different", "interesting", "vegetable", "telephone",
    "television", "microphone", "alligator", "kangaroo", "helicopter", "restaurant",
    "chocolate", "strawberry", "calendar", "dinosaur", "pajamas", "tornado", "volcano",
    "cinnamon", "harmony", "melody", "energy", "history", "memory", "mystery", "victory",
    "galaxy", "gravity", "quantity", "velocity", "hurricane", "avocado", "october",
    "november", "december", "january", "february", "august", "monday", "friday", "sunday",
)  # fmt: skip


def unknown_words() -> tuple[str, ...]:
    """Every ``_unknown_`` word, near misses first, without duplicates, in a fixed order."""
    seen: dict[str, None] = {}
    for w in (*NEAR_MISSES, *OTHER_WORDS):
        seen.setdefault(w, None)
    return tuple(seen)


def check_vocabulary(words: tuple[str, ...]) -> None:
    """Raise ValueError when an unknown word is a command or a homophone of one."""
    bad = sorted(set(words) & (set(SC10_LABELS) | HOMOPHONES))
    if bad:
        raise ValueError(f"unknown-word list holds commands or their homophones: {bad}")


check_vocabulary(unknown_words())
