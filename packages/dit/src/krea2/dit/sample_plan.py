"""What `krea2 dit sample` samples with: weights, text encoder, autoencoder, text length,
prediction, time shift, steps and CFG, from its flags, a model folder and the weights' own
record.

Each setting comes from the first of: the flag; the weights' conditioning record
(`krea2.dit.weights.read_conditioning`, written by the trainer); the model folder
(`--model`); the default. Steps and CFG: the flags; the record's `sampling` (a distilled
student's own steps, no CFG); Turbo's 8 steps without CFG for `--turbo` or a folder marked
`is_distilled`; else the release CLI's 28 steps at CFG 4.5. Weights whose recorded text
conditioning this sampler cannot rebuild, or that a flag would replace by a different one,
are refused: their images would not follow the prompt.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from krea2.dit.components import ComponentSpec, parse_autoencoder, parse_text_encoder
from krea2.dit.flow import TURBO_MU, TURBO_STEPS, TimeShift
from krea2.dit.generation import PREDICTIONS
from krea2.dit.release import read_model_folder
from krea2.dit.weights import read_conditioning
from krea2.infra.errors import UserError

DEFAULT_TEXT_ENCODER = "tiny"
DEFAULT_AUTOENCODER = "pixel"
DEFAULT_TEXT_TOKENS = 512  # the release's fixed text length T
X0_MIN_T = 0.05  # the trainer's default floor of t for x0 predictions
DEFAULT_STEPS, DEFAULT_CFG = 28, 4.5  # the release CLI's defaults for a guided model


@dataclass(frozen=True)
class SamplePlan:
    """Everything `generate` needs besides prompts and sizes."""

    weights: Path  # a .safetensors file or diffusers transformer folder
    text_encoder: ComponentSpec
    autoencoder: ComponentSpec
    text_tokens: int
    prediction: str  # one of generation.PREDICTIONS
    x0_min_t: float
    time_shift: TimeShift
    steps: int = DEFAULT_STEPS
    cfg: float = DEFAULT_CFG  # Krea CFG w; 0: no guidance
    style_module: Path | None = None  # for style references: the flag's, else the folder's

    def describe(self) -> str:
        """One line naming what is used, for the person running the sampler."""
        return (
            f"weights {self.weights}, text encoder {self.text_encoder} ({self.text_tokens} "
            f"tokens), autoencoder {self.autoencoder}, {self.prediction} prediction, "
            f"{self.time_shift}, {self.steps} steps, "
            + (f"CFG {self.cfg:g}" if self.cfg else "no CFG")
        )


def plan_sample(
    *,
    model: Path | None = None,
    weights: Path | None = None,
    text_encoder: str | None = None,
    autoencoder: str | None = None,
    text_tokens: int | None = None,
    prediction: str | None = None,
    mu: float | None = None,
    turbo: bool = False,
    steps: int | None = None,
    cfg: float | None = None,
    style_module: Path | None = None,
) -> SamplePlan:
    """Resolve the settings (see the module docstring). `model`: a model folder
    (`release.read_model_folder`); `weights`: DiT weights, replacing the folder's DiT when
    both are given. UserError when neither is given, for a training checkpoint, and for
    text conditioning that cannot be reproduced. `style_module`: the module for style
    references; None: the model folder's `style.safetensors`, if any."""
    if model is None and weights is None:
        raise UserError("pass --model FOLDER (a whole model) or --weights FILE (a DiT)")
    folder = read_model_folder(model) if model is not None else None
    path = Path(weights) if weights is not None else folder.transformer
    record = read_conditioning(path) or {}  # refuses missing paths and training checkpoints
    text = _text_encoder(path, record, text_encoder, folder.text_encoder if folder else None)
    ae = autoencoder or record.get("autoencoder")
    ae = ae or (folder.autoencoder if folder else None) or DEFAULT_AUTOENCODER
    pred = prediction or record.get("prediction") or "velocity"
    if pred not in PREDICTIONS:
        raise UserError(
            f"{path} predicts {pred!r}, which krea2 dit sample cannot turn into a velocity "
            f"(it samples {', '.join(PREDICTIONS)}); sample the run with "
            "`krea2 train sample RUN_DIR --prompt ...`"
        )
    return SamplePlan(
        weights=path,
        text_encoder=text,
        autoencoder=parse_autoencoder(ae),
        text_tokens=text_tokens or record.get("text_tokens") or DEFAULT_TEXT_TOKENS,
        prediction=pred,
        x0_min_t=float(record.get("x0_min_t", X0_MIN_T)),
        time_shift=_time_shift(mu, turbo, record, folder.time_shift if folder else None),
        **_steps_and_cfg(steps, cfg, record, turbo or bool(folder and folder.distilled)),
        style_module=style_module or (folder.style if folder else None),
    )


def _steps_and_cfg(
    steps: int | None, cfg: float | None, record: dict[str, Any], turbo: bool
) -> dict[str, Any]:
    own = record.get("sampling")
    if own is None:
        own = {"steps": TURBO_STEPS, "cfg": 0.0} if turbo else {}
    chosen = {
        "steps": steps if steps is not None else own.get("steps", DEFAULT_STEPS),
        "cfg": cfg if cfg is not None else own.get("cfg", DEFAULT_CFG),
    }
    if chosen["steps"] < 1 or chosen["cfg"] < 0:
        raise UserError(f"--steps {chosen['steps']} must be >= 1 and --cfg {chosen['cfg']} >= 0")
    return chosen


def _text_encoder(
    path: Path, record: dict[str, Any], flag: str | None, from_folder: str | None
) -> ComponentSpec:
    """The text encoder to use; refuses one that differs from the recorded conditioning."""
    recorded = record.get("text_encoder")
    if recorded is None:
        return parse_text_encoder(flag or from_folder or DEFAULT_TEXT_ENCODER)
    try:
        rebuilt = parse_text_encoder(recorded)
    except UserError:
        rebuilt = None  # e.g. "trainer:words": conditioning only its trainer rebuilds
    chosen = parse_text_encoder(flag) if flag is not None else rebuilt
    if rebuilt is not None and chosen is not None and _same_encoder(chosen, rebuilt):
        return chosen
    use = f"; or pass --text-encoder {recorded}" if rebuilt is not None else ""
    given = f"--text-encoder {flag}" if flag is not None else "krea2 dit sample"
    raise UserError(
        f"{path} was trained with the text conditioning {recorded!r}, which {given} cannot "
        "reproduce (the images would not follow the prompt); sample the run with "
        f"`krea2 train sample RUN_DIR --prompt ...`{use}"
    )


def _same_encoder(a: ComponentSpec, b: ComponentSpec) -> bool:
    """Same kind and seed; a path-based encoder may live at another path (a copied model)."""
    return a.kind == b.kind and (a.number or 0) == (b.number or 0)


def _time_shift(
    mu: float | None, turbo: bool, record: dict[str, Any], from_folder: TimeShift | None
) -> TimeShift:
    if mu is not None:
        return TimeShift(fixed=mu)
    if turbo:
        return TimeShift(fixed=TURBO_MU)
    if record.get("shift") is not None:
        return TimeShift(fixed=record["shift"])
    return from_folder or TimeShift()
