"""The trainer's job config: typed dataclasses loaded from TOML with ``--set`` overrides.

A job is a model, a text conditioner, an optimizer, a parallel layout and a list of
stages (data + resolution + shift + batch + schedule + switches). Field values are
checked here (types by ``krea2.infra.config``, ranges in ``__post_init__``); checks that
need the world size or the model shape live in :mod:`krea2.trainer.validate`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from krea2.infra.errors import UserError
from krea2.infra.shards import CAPTION_FORMATS
from krea2.trainer.choices import (
    Autocast,
    Backend,
    BaseQuant,
    CheckpointingMode,
    Float8Recipe,
    InitDevice,
    OptimizerName,
    ParamDtype,
    Prediction,
    ScheduleDecay,
    SpikeAction,
    parse_enum_fields,
)


@dataclass
class ModelConfig:
    """The DiT: a named ``krea2.dit`` config with field overrides, and its autoencoder."""

    # A krea2.dit config name ("toy", "tiny", "krea2-12b", ...). None: the shape of the
    # released weights the first stage that has them starts from (its init_from, e.g. a
    # model folder), else "toy"; overrides change fields of either.
    name: str | None = None
    overrides: dict[str, int | float | bool | str] = field(default_factory=dict)
    # A krea2.dit registry name: "pixel[:F]" (PixelAE, the toy), "qwen-image:PATH", "flux2:PATH";
    # its spatial factor and latent channels come from the registry.
    autoencoder: str = "pixel"
    ae_factor: int | None = None  # older spelling of autoencoder = "pixel:F" (pixel only)
    dtype: ParamDtype = ParamDtype.FLOAT32  # on one device; FSDP brings bf16 mixed precision
    # LoRA stages on one device: the frozen base's block Linears as torchao weight-only
    # "int8" (CPU or GPU) or "float8" (CUDA, compute capability 8.9+); "none" keeps dtype.
    base_quant: BaseQuant = BaseQuant.NONE
    # Forward under torch.autocast on one device (fp32 master weights, bf16 matmuls):
    # "none", "bfloat16", or "auto" (bf16 where FSDP does not already cast, and on CPUs
    # with AMX or AMD's avx512_bf16: 1.45x per toy step on 2 cores with AMX, 1.5-2x on
    # AMD Zen 4, 0.75x with Intel's avx512_bf16 alone; distributed.cpu_has_fast_bf16).
    autocast: Autocast = Autocast.NONE
    # What the DiT's output means (loss and sampler always work in v):
    # "velocity": v = eps - x, the release.
    # "x0": the clean latent, v = (x_t - x0) / max(t, x0_min_t), as in JiT; the noise never
    #   passes through the network, so a patch wider than the model is no bottleneck.
    # "split": in a stage whose patch is k times the model's, v for the mean of each k x k
    #   block and x0 for the detail inside it. A stage resized from patch p to k*p then
    #   starts exactly where the previous stage ended (its v, upsampled), and the noise of
    #   the new detail passes through analytically instead of through the width-D network
    #   (192 features at patch 8 against width 128 in the toy). Plain v where k = 1.
    prediction: Prediction = Prediction.VELOCITY
    x0_min_t: float = 0.05
    # The SDPA kernel of every attention (krea2.dit.ATTENTION_BACKENDS): "auto" lets PyTorch
    # pick per call; "cudnn", "flash", "efficient" (CUDA) or "math" pin one, and a call the
    # pinned kernel cannot run fails with PyTorch's reason instead of running a slower one.
    attention: str = "auto"
    # "cpu": seeded CPU build; "meta": build on meta, shard, then init on the device (no
    # full copy in host memory); "auto": meta above 2B parameters.
    init_device: InitDevice = InitDevice.AUTO

    def __post_init__(self) -> None:
        from krea2.dit.config import check_overrides

        parse_enum_fields(self)
        from krea2.dit import ATTENTION_BACKENDS

        if self.attention not in ATTENTION_BACKENDS:
            raise ValueError(
                f"model.attention = {self.attention!r}: choose one of "
                f"{', '.join(ATTENTION_BACKENDS)}"
            )
        try:
            check_overrides(self.overrides, "overrides.")
        except UserError as e:  # the loader names the section and the file
            raise ValueError(str(e)) from None


@dataclass
class TextConfig:
    """Text conditioning.

    ``encoder``: ``words``, a learned word-embedding table fanned out over the DiT's taps
    through fixed near-identity projections, trained with the DiT (the toy recipe, no
    download); or a frozen encoder by its ``krea2.dit`` registry name: ``qwen3-vl:PATH``
    (Qwen3-VL from a local folder), ``tiny[:SEED]`` (random tiny Qwen3-VL). Frozen
    encoders give ``max_tokens`` tokens per caption.
    """

    encoder: str = "words"
    path: Path | None = None  # older spelling: encoder = "qwen3-vl" + path = "qwen3-vl:PATH"
    vocab_size: int = 4096  # hash buckets of the word table
    max_tokens: int = 32
    cache_size: int = 0  # frozen encoders: embeddings of this many captions kept in memory


@dataclass
class OptimizerConfig:
    name: OptimizerName = OptimizerName.ADAMW
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.0
    norm_weight_decay: float = 0.0  # decay on zero-centered norm scales (pulls gains to 1)
    muon_momentum: float = 0.95
    muon_lr: float | None = None  # None: same as lr (RMS-matched to AdamW)
    grad_clip: float = 1.0  # max global grad norm; 0 disables

    def __post_init__(self) -> None:
        parse_enum_fields(self)


@dataclass
class ScheduleConfig:
    """Warmup-stable-decay: linear warmup, constant, then decay to ``min_lr_factor``."""

    warmup_steps: int = 50
    decay_ratio: float = 0.1  # fraction of the stage's steps spent decaying
    decay: ScheduleDecay = ScheduleDecay.LINEAR
    min_lr_factor: float = 0.0

    def __post_init__(self) -> None:
        parse_enum_fields(self)
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps={self.warmup_steps} must be >= 0")
        if not 0.0 <= self.decay_ratio <= 1.0:
            raise ValueError(f"decay_ratio={self.decay_ratio} must be in [0, 1]")
        if not 0.0 <= self.min_lr_factor <= 1.0:
            raise ValueError(f"min_lr_factor={self.min_lr_factor} must be in [0, 1]")


@dataclass
class ParallelConfig:
    """Device mesh: ``dp * tp`` must equal the world size (``dp = 0``: world // tp)."""

    dp: int = 0
    tp: int = 1
    backend: Backend = Backend.AUTO
    timeout_s: float = 600.0  # collective timeout
    async_tp: bool = False  # GPU + compile + tp > 2
    deterministic: bool = False  # torch deterministic algorithms (CPU tests, resume proofs)
    threads: int = 0  # intra-op CPU threads per rank; 0 leaves torch's default
    # CPU ranks: glibc malloc keeps freed blocks (krea2.infra.heap), so a step reuses the last
    # step's pages instead of faulting ~50 MB back in (toy DiT, batch 64).
    keep_freed_memory: bool = True

    def __post_init__(self) -> None:
        parse_enum_fields(self)


@dataclass
class IrepaConfig:
    """iREPA: a conv projector aligns block ``layer``'s image tokens to encoder patches."""

    steps: int = 0  # on for the stage's first ``steps`` steps, then off
    weight: float = 1.0
    layer: int = 1  # index of the DiT block whose output is aligned
    encoder: str = "tiny"  # "tiny" (random frozen conv net) or "hf:/path" (transformers)
    encoder_dim: int = 64


# Every single-stream block's attention projections (gate included) and SwiGLU matrices,
# as a regex over the DiT's module names (full match; the released key names).
DEFAULT_LORA_TARGETS = r"blocks\.\d+\.(attn\.(wq|wk|wv|gate|wo)|mlp\.(gate|up|down))"


@dataclass
class LoraConfig:
    """A stage that trains LoRA adapters (through ``peft``) on a frozen DiT; ``rank = 0``:
    the stage trains the full model. The update of a target Linear W is
    ``(alpha / rank) * B @ A``, A [rank, in] (Kaiming), B [out, rank] (zeros)."""

    rank: int = 0
    alpha: float | None = None  # None: alpha = rank (scale 1)
    dropout: float = 0.0  # on the adapter's input, drawn from the checkpointed torch RNG
    targets: str = DEFAULT_LORA_TARGETS  # regex (full match) over the DiT's module names

    def __post_init__(self) -> None:
        if self.rank < 0:
            raise ValueError(f"lora.rank={self.rank} must be >= 0 (0: full fine-tuning)")
        if self.alpha is not None and self.alpha <= 0:
            raise ValueError(f"lora.alpha={self.alpha} must be positive")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora.dropout={self.dropout} must be in [0, 1)")
        try:
            re.compile(self.targets)
        except re.error as e:
            raise ValueError(f"lora.targets={self.targets!r} is not a regex: {e}") from e

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def scale(self) -> float:
        return (self.alpha if self.alpha is not None else self.rank) / max(self.rank, 1)


@dataclass
class StageConfig:
    """One training stage; a recipe is a list of these run in order."""

    name: str = "pretrain"
    data: list[str] = field(default_factory=list)  # Parquet files or globs
    eval_data: list[str] = field(default_factory=list)
    resolution: int = 32  # nominal side in pixels (buckets are checked against it)
    steps: int = 100
    batch_size: int = 64  # global batch (split over dp ranks)
    time_shift: float | None = None  # mu of the shifted logit-normal; None: resolution rule
    time_loc: float = 0.0
    time_scale: float = 1.0
    caption_weights: dict[str, float] = field(
        default_factory=lambda: {"long": 0.3, "medium": 0.3, "short": 0.2, "tags": 0.1, "json": 0.1}
    )
    caption_dropout: float = 0.1
    lr: float | None = None  # None: optimizer.lr
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    checkpointing: CheckpointingMode = CheckpointingMode.NONE
    compile: bool = False
    compile_backend: str = "inductor"
    float8: Float8Recipe = Float8Recipe.NONE
    float8_emulate: bool = False  # torchao's emulation (CPU tests only)
    irepa: IrepaConfig = field(default_factory=IrepaConfig)
    # "previous" stage, "none", a checkpoint directory (DCP), or released weights: a native
    # .safetensors, a diffusers transformer folder or a whole model folder (krea2.dit's
    # readers); released weights must match the model config (one error names the fields).
    init_from: str = "previous"
    lora: LoraConfig = field(default_factory=LoraConfig)
    shuffle: bool = True
    # DiT patch for this stage (None: the model config's). A stage that starts from a stage
    # with another patch gets the patch embedding and final projection resized
    # (krea2.dit.patch_resize), e.g. 32 px at patch 4 then 64 px at patch 8: the same token
    # grid and cost per step, the model starting as its own upsampled self.
    patch: int | None = None
    # > 0: keep an EMA of the trainable weights (this decay per optimizer step, averaging
    # about the last 1 / (1 - decay) steps); the stage's result (its last checkpoint, its
    # LoRA adapters, the next stage's start) is the average. Checkpoints hold it.
    ema_decay: float = 0.0
    # The stage's loss: a registered objective (krea2.trainer.objectives; "flow" is flow
    # matching, krea2-rl adds dpo, stpo, grpo, nft, tdm, dmd2) and its own settings table, which the
    # objective's library builds into its config type ([stages.settings] in TOML).
    objective: str = "flow"
    settings: dict[str, Any] = field(default_factory=dict)
    # Judge loss and grad-norm spikes (stability.*)? None: the objective's default (off
    # for preference and RL losses). Non-finite steps are dropped either way.
    spike_guard: bool | None = None
    # The name of an earlier stage of this job that trained a style-reference module: this
    # stage fine-tunes that module alone (the base frozen: the style stage's start), e.g.
    # by preference optimization on pairs with a reference column. "": no style module.
    style_from: str = ""

    def __post_init__(self) -> None:
        parse_enum_fields(self)
        if not 0.0 <= self.ema_decay < 1.0:
            raise ValueError(f"stage {self.name!r}: ema_decay={self.ema_decay} must be in [0, 1)")
        if self.steps <= 0:
            raise ValueError(f"stage {self.name!r}: steps={self.steps} must be positive")
        if self.batch_size <= 0:
            raise ValueError(f"stage {self.name!r}: batch_size={self.batch_size} must be positive")
        if self.patch is not None and self.patch <= 0:
            raise ValueError(f"stage {self.name!r}: patch={self.patch} must be positive")
        if not 0.0 <= self.caption_dropout < 1.0:
            raise ValueError(f"stage {self.name!r}: caption_dropout must be in [0, 1)")
        for fmt, w in self.caption_weights.items():
            if fmt not in CAPTION_FORMATS:
                raise ValueError(
                    f"stage {self.name!r}: caption format {fmt!r} is not one of {CAPTION_FORMATS}"
                )
            if w < 0:
                raise ValueError(f"stage {self.name!r}: caption weight {fmt}={w} is negative")
        if sum(self.caption_weights.values()) <= 0:
            raise ValueError(f"stage {self.name!r}: caption_weights must not all be zero")
        if self.style_from and (self.lora.enabled or self.objective == "style"):
            raise ValueError(
                f"stage {self.name!r}: style_from={self.style_from!r} fine-tunes a trained style "
                "module alone; it cannot be a LoRA stage or a style stage (which trains a new one)"
            )


@dataclass
class CheckpointConfig:
    every: int = 100  # steps between async checkpoints; 0: only at the end of a stage
    keep_last: int = 3
    # also keep the checkpoints after every keep_every steps (steps 199, 399, ... for 200):
    # PMA's inputs (krea2 train pma --every)
    keep_every: int | None = None
    async_save: bool = True


@dataclass
class StabilityConfig:
    """Loss and grad-norm spike detection against running statistics."""

    action: SpikeAction = SpikeAction.SKIP
    warmup_steps: int = 20  # statistics warm up before spikes are judged
    loss_sigma: float = 6.0  # spike: loss > mean + sigma * std (running, over clean steps)
    grad_factor: float = 10.0  # spike: grad norm > factor * running mean
    window: int = 50
    max_bad_steps: int = 10  # consecutive skipped steps before the run stops
    max_bad_samples: float = 0.5  # fraction of undecodable samples in a batch that stops the run

    def __post_init__(self) -> None:
        parse_enum_fields(self)


@dataclass
class ObserveConfig:
    log_every: int = 1
    eval_every: int = 0  # 0: only at the end of a stage
    sample_every: int = 0  # 0: only at the end of a stage
    sample_prompts: list[str] = field(default_factory=list)
    sample_seeds: list[int] = field(default_factory=lambda: [0])
    sample_steps: int = 20
    sample_cfg: float = 2.0
    prometheus_port: int | None = None  # local rank r serves port + r
    peak_tflops: float = 0.0  # per device, for MFU; 0 leaves MFU out
    eval_batches: int = 4
    eval_times: list[float] = field(default_factory=lambda: [0.1, 0.3, 0.5, 0.7, 0.9])
    # Experiment tracking (krea2.infra.tracking): "tensorboard" (RUN_DIR/tensorboard),
    # "wandb", "mlflow" or "none"; the same scalars, sample grids and config as metrics.jsonl.
    tracker: str = "tensorboard"
    tracker_project: str = "krea2"
    tracker_name: str | None = None  # None: the run directory's name
    tracker_uri: str | None = None  # MLflow tracking URI (None: RUN_DIR/mlruns)
    # LoRA stages: also sample the prompt x seed grid with the adapter on a second base
    # (released weights, e.g. train on Raw, validate on Turbo), at its own steps and CFG;
    # its time shift is the model folder's scheduler's when it has one, else the stage's.
    second_base: str | None = None
    second_base_steps: int = 8
    second_base_cfg: float = 0.0

    def __post_init__(self) -> None:
        from krea2.infra.tracking import TRACKERS

        if self.tracker not in TRACKERS:
            raise ValueError(f"tracker={self.tracker!r} is not one of {list(TRACKERS)}")


@dataclass
class DataConfig:
    workers: int = 2  # decode processes per rank; 0 decodes in the training process
    prefetch: int = 4  # batches each worker prepares ahead
    cache_latents: int = 0  # frozen autoencoders: latents of this many samples kept (by key)
    # Frozen encoders' outputs (latents by sample key and size, text embeddings by caption)
    # on disk under DIR/<encoder fingerprint>/, so an epoch over a small set encodes once
    # and later runs of the same encoders none (krea2.trainer.cache). None: memory only.
    cache_dir: str | None = None


@dataclass
class JobConfig:
    """The whole training job (``krea2 train --config job.toml``)."""

    run_dir: Path = Path("runs/toy")
    seed: int = 0
    model: ModelConfig = field(default_factory=ModelConfig)
    text: TextConfig = field(default_factory=TextConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    stability: StabilityConfig = field(default_factory=StabilityConfig)
    observe: ObserveConfig = field(default_factory=ObserveConfig)
    stages: list[StageConfig] = field(default_factory=list)
    # The run file's cluster placement, read by `krea2 infra launch`
    # (krea2.infra.k8s.config.LaunchConfig); the trainer keeps it only to save it.
    launch: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        names = [s.name for s in self.stages]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"stage names must be unique; {sorted(dup)[0]!r} repeats")


def load_job(path: str | Path | None = None, overrides: Sequence[str] = ()) -> JobConfig:
    """The job config of a TOML file (None: the defaults) with ``--set`` overrides such as
    ``optimizer.lr=3e-4`` or ``stages.1.steps=500`` (a number indexes ``[[stages]]``).

    ConfigError (one message naming the key, the file and the closest valid key or value)
    on any mistake; checks that need the world size are :func:`krea2.trainer.validate.validate_job`.
    """
    from krea2.infra.config import load_config

    return load_config(JobConfig, path, overrides)
