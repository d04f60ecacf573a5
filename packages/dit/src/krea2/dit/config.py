"""DiT configuration: one dataclass, the released shape and small named configs."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from krea2.infra.errors import UserError

# The attention's SDPA kernels by name (krea2.dit.set_attention_backend): "auto" is PyTorch's
# own choice per call; the others pin one kernel.
ATTENTION_BACKENDS = ("auto", "cudnn", "flash", "efficient", "math")


def round_up(x: int, multiple: int) -> int:
    """Smallest multiple of `multiple` that is >= x."""
    return -(-x // multiple) * multiple


def swiglu_hidden(width: int, multiplier: int) -> int:
    """The release's SwiGLU hidden size: round_up(int(2*width/3) * multiplier, 128)."""
    return round_up(int(2 * width / 3) * multiplier, 128)


def rope_axes_for(head_dim: int) -> tuple[int, int, int]:
    """The release's split of rotated head dims over (axis0, row, col): 128 -> (32, 48, 48)."""
    u = head_dim // 16
    return (head_dim - 12 * u, 6 * u, 6 * u)


@dataclass
class DiTConfig:
    """Shape of a Krea 2 single-stream DiT. Defaults are the released `krea2-12b`.

    Names are descriptive; the checkpoint keys (`first`, `tmlp`, `txtfusion`, ...) are module
    names in `model.py`. Ablation switches (report §3) default to the release.
    """

    width: int = 6144  # model width D
    depth: int = 28  # single-stream blocks
    heads: int = 48  # query heads; head_dim = width // heads
    kv_heads: int = 12  # GQA: query head j reads KV head j // (heads // kv_heads)
    mlp_multiplier: int = 4
    mlp_hidden: int | None = None  # None: swiglu_hidden(width, mlp_multiplier)
    time_dim: int = 256  # sinusoidal timestep width
    text_dim: int = 2560  # text-encoder hidden size
    text_taps: int = 12  # number of tapped encoder layers stacked per token
    text_heads: int = 20
    text_kv_heads: int = 20
    text_mlp_hidden: int | None = None  # None: swiglu_hidden(text_dim, mlp_multiplier)
    layerwise_blocks: int = 2  # text-fusion blocks over the tap axis
    refiner_blocks: int = 2  # text-fusion blocks over tokens
    patch: int = 2  # latent patch side
    latent_channels: int = 16  # autoencoder latent channels
    rope_theta: float = 1000.0
    rope_axes: list[int] | None = None  # None: rope_axes_for(rotated dims)
    norm_eps: float = 1e-5
    # --- ablation switches (defaults = release) ---
    attn_gate: bool = True  # per-channel sigmoid output gate in every attention
    rope_fraction: float = 1.0  # fraction of each head's dims that RoPE rotates (partial RoPE)
    timestep_tokens: int = 0  # >0: that many in-context time tokens replace all modulation
    # 0 (the release): image token (i, j) sits at RoPE position (i, j). n > 0: position
    # interpolation, image positions scaled by n / sqrt(grid_h * grid_w), so an image of any
    # resolution spans the range an n x n grid does and a stage at twice the resolution
    # keeps the positions the stage before it learned.
    rope_ref_grid: int = 0
    name: str = field(default="custom", compare=False)

    def __post_init__(self) -> None:
        if self.rope_axes is not None:
            self.rope_axes = [int(a) for a in self.rope_axes]
        self.validate()

    # ---- derived shapes ----
    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    @property
    def text_head_dim(self) -> int:
        return self.text_dim // self.text_heads

    @property
    def mlp_hidden_size(self) -> int:
        return self.mlp_hidden or swiglu_hidden(self.width, self.mlp_multiplier)

    @property
    def text_mlp_hidden_size(self) -> int:
        return self.text_mlp_hidden or swiglu_hidden(self.text_dim, self.mlp_multiplier)

    @property
    def rope_dims(self) -> int:
        """Number of leading head dims RoPE rotates (the rest pass through)."""
        if self.rope_axes is not None:
            return sum(self.rope_axes)
        return 2 * round(self.head_dim * self.rope_fraction / 2)

    @property
    def rope_axes_dims(self) -> tuple[int, int, int]:
        if self.rope_axes is not None:
            return tuple(self.rope_axes)  # type: ignore[return-value]
        return rope_axes_for(self.rope_dims)

    @property
    def in_channels(self) -> int:
        """Features per packed image token: latent_channels * patch**2."""
        return self.latent_channels * self.patch * self.patch

    @property
    def modulated(self) -> bool:
        """True for the release's shared AdaLN-style modulation, False with time tokens."""
        return self.timestep_tokens == 0

    def replace(self, **changes: Any) -> DiTConfig:
        """A copy with fields changed (validated)."""
        changes.setdefault("name", "custom")
        return dataclasses.replace(self, **changes)

    def validate(self) -> None:
        """Raise UserError naming the first inconsistent field."""

        def bad(msg: str) -> None:
            raise UserError(f"DiTConfig {self.name!r}: {msg}")

        for f in ("width", "depth", "heads", "kv_heads", "time_dim", "text_dim", "text_taps"):
            if getattr(self, f) <= 0:
                bad(f"{f}={getattr(self, f)} must be positive")
        if self.width % self.heads:
            bad(f"width={self.width} is not divisible by heads={self.heads}")
        if self.heads % self.kv_heads:
            bad(f"heads={self.heads} is not divisible by kv_heads={self.kv_heads}")
        if self.text_dim % self.text_heads:
            bad(f"text_dim={self.text_dim} is not divisible by text_heads={self.text_heads}")
        if self.text_heads % self.text_kv_heads:
            bad(f"text_heads={self.text_heads} not divisible by text_kv_heads={self.text_kv_heads}")
        if self.time_dim % 2:
            bad(f"time_dim={self.time_dim} must be even (cos and sin halves)")
        if not 0.0 <= self.rope_fraction <= 1.0:
            bad(f"rope_fraction={self.rope_fraction} must be in [0, 1]")
        if self.rope_ref_grid < 0:
            bad(f"rope_ref_grid={self.rope_ref_grid} must be 0 (off) or a grid side > 0")
        if self.rope_axes is not None and self.rope_fraction != 1.0:
            bad("set either rope_axes or rope_fraction, not both")
        axes = self.rope_axes_dims
        if len(axes) != 3 or any(a % 2 or a < 0 for a in axes):
            bad(f"rope axes {axes} must be three non-negative even numbers")
        if sum(axes) > self.head_dim:
            bad(f"rope axes {axes} sum to more than head_dim={self.head_dim}")
        if not 0 <= self.timestep_tokens <= 64:
            bad(f"timestep_tokens={self.timestep_tokens} must be in [0, 64] (report: 4-16)")
        if self.patch <= 0 or self.latent_channels <= 0:
            bad("patch and latent_channels must be positive")


_RELEASE = DiTConfig(name="krea2-12b")

CONFIGS: dict[str, DiTConfig] = {
    # The released Raw/Turbo shape: 12,820,073,036 parameters, 430 tensors.
    "krea2-12b": _RELEASE,
    # diffusers' own test shape: head_dim 8, GQA 4/2, 2 blocks, 3 taps, axes (4, 2, 2).
    "tiny": DiTConfig(
        width=32,
        depth=2,
        heads=4,
        kv_heads=2,
        mlp_hidden=64,
        time_dim=32,
        text_dim=16,
        text_taps=3,
        text_heads=2,
        text_kv_heads=2,
        text_mlp_hidden=32,
        layerwise_blocks=1,
        refiner_blocks=1,
        patch=2,
        latent_channels=4,
        rope_axes=[4, 2, 2],
        name="tiny",
    ),
    # The toy recipe: PixelAE pixels, patch 4 on 32x32.
    "toy": DiTConfig(
        width=128,
        depth=4,
        heads=4,
        kv_heads=2,
        mlp_hidden=512,
        time_dim=128,
        text_dim=64,
        text_taps=3,
        text_heads=2,
        text_kv_heads=2,
        text_mlp_hidden=256,
        layerwise_blocks=1,
        refiner_blocks=1,
        patch=4,
        latent_channels=3,
        name="toy",
    ),
    # The benchmark shape (benchmarks/dit.py): width 512, 4 blocks, GQA 8/2.
    "bench-512": DiTConfig(
        width=512,
        depth=4,
        heads=8,
        kv_heads=2,
        time_dim=256,
        text_dim=256,
        text_taps=4,
        text_heads=4,
        text_kv_heads=4,
        layerwise_blocks=1,
        refiner_blocks=1,
        patch=2,
        latent_channels=16,
        name="bench-512",
    ),
}


# DiTConfig field types an override is checked against (rope_axes, a list, is not).
_SCALARS = {"int": int, "int | None": int, "float": float, "bool": bool}
_TYPE_WORDS = {int: "a whole number", float: "a number", bool: "true or false"}


def _fits(value: Any, want: type) -> bool:
    if isinstance(value, bool):
        return want is bool
    return isinstance(value, want) or (want is float and isinstance(value, int))


def check_overrides(overrides: Mapping[str, Any], prefix: str = "") -> None:
    """UserError naming the first override that is no DiTConfig field (with the closest
    field) or whose value has the wrong type; ``prefix`` is how the caller spells the
    table (``model.overrides.``)."""
    kinds = {
        f.name: f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        for f in dataclasses.fields(DiTConfig)
        if f.name != "name"
    }
    for key, value in overrides.items():
        if key not in kinds:
            close = difflib.get_close_matches(key, list(kinds), n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"fields: {', '.join(kinds)}"
            raise UserError(f"{prefix}{key} is not a DiT config field; {hint}")
        want = _SCALARS.get(kinds[key])
        if want is not None and not _fits(value, want):
            raise UserError(f"{prefix}{key} = {value!r} must be {_TYPE_WORDS[want]}")


def get_config(name: str, **overrides: Any) -> DiTConfig:
    """A named config (`krea2-12b`, `tiny`, `toy`, `bench-512`), optionally with fields
    changed; UserError for an unknown name, field or a value of the wrong type."""
    if name not in CONFIGS:
        raise UserError(f"unknown DiT config {name!r}; choose one of {', '.join(CONFIGS)}")
    check_overrides(overrides)
    cfg = dataclasses.replace(CONFIGS[name])
    return cfg.replace(name=name, **overrides) if overrides else cfg
