"""krea2.krablet."""

__version__ = "0.1.0"
