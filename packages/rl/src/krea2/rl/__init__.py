"""krea2.rl."""

__version__ = "0.1.0"
