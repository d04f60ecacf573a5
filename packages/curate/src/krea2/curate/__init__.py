"""krea2.curate."""

__version__ = "0.1.0"
