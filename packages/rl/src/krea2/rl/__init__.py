"""krea2.rl: its public API is built by the rl issues (#18, #19); nothing is exported yet."""

__version__ = "0.1.0"

__all__: list[str] = []
