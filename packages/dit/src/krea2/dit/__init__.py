"""krea2.dit."""

__version__ = "0.1.0"
