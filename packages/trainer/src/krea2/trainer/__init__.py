"""krea2.trainer."""

__version__ = "0.1.0"
