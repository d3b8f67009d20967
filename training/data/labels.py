"""Label vocabularies shared by the speech-command data sources."""

from __future__ import annotations

#: The ten keyword classes of the SC10 subset of Google Speech Commands, in label-index order.
SC10_LABELS: tuple[str, ...] = (
    "yes",
    "no",
    "up",
    "down",
    "left",
    "right",
    "on",
    "off",
    "stop",
    "go",
)

#: Sample rate of every speech clip produced by this package.
SAMPLE_RATE = 16_000

#: Length of one clip (1 s at ``SAMPLE_RATE``).
CLIP_SAMPLES = 16_000


def label_index(word: str, labels: tuple[str, ...] = SC10_LABELS) -> int:
    """Return the class index of ``word`` in ``labels`` (raises ``ValueError`` if absent)."""
    try:
        return labels.index(word)
    except ValueError:
        raise ValueError(f"unknown label {word!r}; expected one of {labels}") from None
