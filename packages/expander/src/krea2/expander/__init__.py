"""krea2.expander: its public API is built by the expander issue (#20); nothing is exported yet."""

__version__ = "0.1.0"

__all__: list[str] = []
