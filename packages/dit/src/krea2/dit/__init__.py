"""krea2.dit: the Krea 2 single-stream DiT, text conditioning, autoencoders and flow sampling.

Submodules import torch; this package root stays cheap (the CLI imports it).
"""

__version__ = "0.1.0"
