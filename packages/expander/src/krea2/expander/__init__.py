"""krea2.expander."""

__version__ = "0.1.0"
