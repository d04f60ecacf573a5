"""Flag values of the form ``PATH[:NUMBER]`` (``--style-ref ref.png:0.7``, ``--lora
a.safetensors:0.8``)."""

from __future__ import annotations

__all__ = ["split_number_suffix"]


def split_number_suffix(spec: str) -> tuple[str, float | None]:
    """'a.png:0.7' -> ('a.png', 0.7); 'a.png' -> ('a.png', None). The text after the last
    ':' is a number only when it reads as one, so a path that holds ':' (c:/x.png) stays
    whole; nan and inf read as numbers (the caller says what it accepts)."""
    head, sep, tail = spec.rpartition(":")
    if not sep:
        return spec, None
    try:
        return head, float(tail)
    except ValueError:
        return spec, None
