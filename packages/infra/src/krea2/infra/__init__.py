"""krea2.infra."""

__version__ = "0.1.0"
