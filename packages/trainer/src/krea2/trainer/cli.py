"""``krea2 train``: run a training job, plot its curves, average or merge checkpoints."""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(
    help=(
        "Train krea2.dit models (FSDP2 + TP on torchrun).\n\n"
        "Example: krea2 train toy-data data/toy && krea2 train --config configs/toy/pretrain.toml "
        "--set stages.0.steps=100; "
        "many ranks: torchrun --nproc-per-node 8 -m krea2.trainer --config job.toml"
    ),
    no_args_is_help=True,
    invoke_without_command=True,
)


def run_job(
    config: Path, overrides: list[str], resume: bool, dry_run: bool = False, extend: bool = False
) -> None:
    """Load, check (the config, the files it names and the shards; before any work, so a
    mistake leaves no run directory), then train. Shared by the CLI and ``-m krea2.trainer``."""
    from krea2.infra.logging import setup_logging
    from krea2.trainer.config import load_job
    from krea2.trainer.distributed import shutdown, world_size
    from krea2.trainer.preflight import preflight
    from krea2.trainer.run_paths import absolute_paths

    cfg = load_job(config, overrides)
    # the config, the model files and the shards: every problem, one error: line each
    for warning in preflight(cfg, world_size()):
        typer.echo(f"warning: {warning}", err=True)
    if dry_run:
        typer.echo(f"config {config} is valid for {world_size()} rank(s)")
        return
    cfg = absolute_paths(cfg)  # what the run records: it works from any directory
    setup_logging("INFO", file=Path(cfg.run_dir) / "train.log.jsonl")
    from krea2.trainer.runinfo import save_run_info
    from krea2.trainer.trainer import Trainer

    if extend and not resume:
        from krea2.infra.errors import UserError

        raise UserError("--extend continues a finished stage of a run: use it with --resume")
    trainer = Trainer(cfg, resume=resume, extend=extend)
    if trainer.env.is_main:
        save_run_info(cfg, Path(cfg.run_dir), trainer.env.world)
    finished = False
    try:
        trainer.run()
        finished = True
    finally:
        shutdown(synchronize=finished)


@app.callback()
def train(
    ctx: typer.Context,
    config: Path = typer.Option(
        None, "--config", "-c", help="job TOML (configs/toy/pretrain.toml)"
    ),
    set_: list[str] = typer.Option(
        [], "--set", help="override a key, e.g. --set optimizer.lr=3e-4 (repeatable)"
    ),
    resume: bool = typer.Option(False, "--resume", help="continue from the newest checkpoint"),
    extend: bool = typer.Option(
        False, "--extend", help="with --resume: continue finished stages to more steps"
    ),
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="only check the config, the model files' configs and the shards (no weights loaded)",
    ),
) -> None:
    """Run the job in --config (one process here; use torchrun for several)."""
    if ctx.invoked_subcommand is not None:
        return
    if config is None:
        typer.echo(ctx.get_help())
        raise typer.Exit(0)
    run_job(config, set_, resume, dry_run, extend)


@app.command("toy-data")
def toy_data(
    out: Path = typer.Argument(..., help="folder for blobs-32/, blobs-32-eval/, blobs-64/, ..."),
    rows: int = typer.Option(4096, "--rows", help="training rows per resolution"),
    eval_rows: int = typer.Option(256, "--eval-rows", help="held-out rows per resolution"),
    sides: str = typer.Option("32,64", "--sides", help="comma-separated image sides in px"),
    seed: int = typer.Option(0, "--seed", help="draw seed (held-out rows use seed + 1)"),
) -> None:
    """Write the synthetic shards configs/toy/pretrain.toml trains on: numbered coloured
    blobs in a 3x3 grid, captioned "blob K in cell C" (krea2.trainer.testing).

    Example: krea2 train toy-data data/toy && krea2 train --config configs/toy/pretrain.toml
    """
    from krea2.infra.errors import UserError
    from krea2.trainer.testing import write_toy_dataset

    try:
        side_list = tuple(int(s) for s in sides.split(","))
    except ValueError:
        raise UserError(f"--sides {sides!r} must be comma-separated whole numbers") from None
    if rows < 1 or eval_rows < 1 or any(s < 8 for s in side_list):
        raise UserError("--rows and --eval-rows must be positive and every side at least 8 px")
    written = write_toy_dataset(out, side_list, rows, eval_rows, seed)
    for name, n in written.items():
        typer.echo(f"{n} rows in {out / name}")


@app.command()
def plot(
    run_dir: Path = typer.Argument(..., help="a run directory holding metrics.jsonl"),
    out: str | None = typer.Option(
        None,
        "--out",
        help="output prefix, or a folder (ends with / or exists) for "
        "FOLDER/curves.png and .html (default RUN_DIR/curves)",
    ),
) -> None:
    """Write loss curves as PNG and an HTML page with the newest sample grids.

    Example: krea2 train plot runs/toy-pretrain --out plots/
    """
    from krea2.trainer.plot import plot_run

    prefix = None
    if out is not None:  # a folder holds curves.png and curves.html, as the default does
        folder = out.endswith(("/", "\\")) or Path(out).is_dir()
        prefix = Path(out) / "curves" if folder else Path(out)
        prefix.parent.mkdir(parents=True, exist_ok=True)
    png, html = plot_run(run_dir, prefix)
    typer.echo(f"wrote {png} and {html}")


@app.command()
def pma(
    run_dir: Path = typer.Argument(..., help="run directory"),
    stage: str = typer.Option(..., "--stage", help="stage whose checkpoints are averaged"),
    last: int = typer.Option(4, "--last", help="number of checkpoints to average (N)"),
    every: int = typer.Option(0, "--every", help="take checkpoints at multiples of K steps"),
    out: Path = typer.Option(..., "--out", help="output weights (.safetensors, released keys)"),
) -> None:
    """Average the last N checkpoints (PMA) into released-key safetensors that record the
    run's text conditioning, prediction type and time shift.

    Example: krea2 train pma runs/toy-pretrain --stage p32 --last 4 --every 200
    --out pma.safetensors
    """
    from krea2.trainer.merge import pma_from_run

    steps = pma_from_run(run_dir, stage, last, every, out)
    typer.echo(f"averaged steps {steps} into {out}")


@app.command()
def merge(
    sources: list[Path] = typer.Argument(..., help="checkpoint step directories or .safetensors"),
    weights: str = typer.Option("", "--weights", help="comma-separated, e.g. 0.5,0.3,0.2"),
    config: Path = typer.Option(
        ..., "--config", help="the job config the sources were trained with"
    ),
    out: Path = typer.Option(..., "--out", help="output weights (.safetensors)"),
    stage: str = typer.Option(
        None, "--stage", help="stage whose settings are recorded (default: the folders' stage)"
    ),
    method: str = typer.Option(
        "average", "--method", help="average (uniform/weighted), ties or task-arithmetic"
    ),
    base: Path = typer.Option(
        None, "--base", help="ties, task-arithmetic: the checkpoint the sources started from"
    ),
    density: float = typer.Option(0.2, "--density", help="ties: share of each task vector kept"),
    scale: float = typer.Option(1.0, "--scale", help="task-arithmetic: scale of the sum"),
    trust: bool = typer.Option(
        False,
        "--trust-checkpoints",
        help="load checkpoint folders from outside the config's run folder (they are pickles)",
    ),
) -> None:
    """Merge domain checkpoints (uniform, weighted, TIES or task arithmetic against their
    common base) into one, recording the run's text conditioning, prediction type and time
    shift in the file. Averaging dilutes a change only one domain made to its weight; task
    arithmetic (base + the task vectors in full) keeps it (docs/trainer.md).

    Example: krea2 train merge runs/toy-pretrain/checkpoints/p32/step-000000999
    runs/toy-pretrain/checkpoints/p32/step-000001799 --weights 0.3,0.7
    --config runs/toy-pretrain/config.toml --out merged.safetensors
    """
    from krea2.trainer.merge import merge_to_file

    w = [float(x) for x in weights.split(",")] if weights else None
    merge_to_file(sources, w, config, out, stage, method, base, density, scale, trust)
    typer.echo(f"merged {len(sources)} checkpoints into {out}")


@app.command()
def memory(
    model: str = typer.Option("krea2-12b", "--model", help="a krea2.dit config name"),
    side: int = typer.Option(1024, "--side", help="image side in pixels"),
    rank: int = typer.Option(64, "--rank", help="LoRA rank"),
    batch: int = typer.Option(1, "--batch", help="images per GPU"),
    gpus: str = typer.Option("1,8,64", "--gpus", help="comma-separated GPU counts"),
) -> None:
    """Print the per-GPU memory projection of LoRA (bf16/int8/float8 base) and full
    fine-tuning under FSDP, as a Markdown table (the one in docs/trainer.md).

    Example: krea2 train memory --model krea2-12b --side 1024 --gpus 1,8,64
    """
    from krea2.dit.config import get_config
    from krea2.trainer.finetune_projection import memory_table

    counts = tuple(int(g) for g in gpus.split(",") if g.strip())
    typer.echo(memory_table(get_config(model), counts, side, rank, batch))


@app.command("export-lora")
def export_lora(
    run_dir: Path = typer.Argument(..., help="a run directory of krea2 train (holds config.toml)"),
    out: Path = typer.Option(..., "--out", help="output folder (diffusers) or file"),
    fmt: str = typer.Option(
        "diffusers",
        "--format",
        help="diffusers | comfyui | krea-merged (.safetensors) | diffusers-merged (folder)",
    ),
    stage: str = typer.Option(None, "--stage", help="LoRA stage (default: the last one)"),
    step: str = typer.Option("latest", "--step", help="checkpoint step, or latest"),
    base: Path = typer.Option(
        None, "--base", help="merged formats: the base weights (default: the stage's init_from)"
    ),
    force: bool = typer.Option(False, "--force", help="replace an existing --out"),
) -> None:
    """Write a LoRA stage's adapter for diffusers (Krea2Pipeline.load_lora_weights), ComfyUI,
    or merged into its base as released-key or diffusers weights.

    Example: krea2 train export-lora runs/lora --format diffusers --out lora/
    """
    from krea2.infra.errors import UserError
    from krea2.trainer.adapters import AdapterFormat, check_export_target, export_run_adapter

    choices = [f.value for f in AdapterFormat]
    if fmt not in choices:
        raise UserError(f"--format {fmt!r} is not one of {choices}")
    check_export_target(out, fmt, force)
    if step != "latest" and not step.isdigit():
        raise UserError(f"--step {step!r} must be a checkpoint step number or 'latest'")
    at = None if step == "latest" else int(step)
    path = export_run_adapter(run_dir, out, fmt, stage, at, base)
    typer.echo(f"wrote {path}")


@app.command("export")
def export(
    run_dir: Path = typer.Argument(..., help="a run directory of krea2 train (holds config.toml)"),
    out: Path = typer.Option(..., "--out", help="a .safetensors file (release) or a folder"),
    layout: str = typer.Option(
        "release", "--layout", help="release (one file) | diffusers (a Krea2Pipeline folder)"
    ),
    stage: str = typer.Option(None, "--stage", help="stage (default: the last one trained)"),
    force: bool = typer.Option(False, "--force", help="replace an existing --out"),
) -> None:
    """Write a finished stage as the model users run: the release's single file (with how
    to sample it), or a diffusers pipeline folder beside the run's components.

    Example: krea2 train export runs/chain --stage rl --layout diffusers --out raw/
    """
    from krea2.trainer.inference import load_run, pick_stage
    from krea2.trainer.stage_export import export_stage

    job = load_run(run_dir)
    path = export_stage(job, pick_stage(job, stage), out, layout, force)
    typer.echo(f"wrote {path}")


@app.command()
def sample(
    run_dir: Path = typer.Argument(..., help="a run directory of krea2 train (holds config.toml)"),
    prompt: list[str] = typer.Option(..., "--prompt", "-p", help="a prompt (repeatable)"),
    out: Path = typer.Option(..., "--out", help="output folder for grid.png and the images"),
    stage: str = typer.Option(
        None, "--stage", help="stage to sample (default: the last one with a checkpoint)"
    ),
    step: str = typer.Option("latest", "--step", help="checkpoint step, or latest"),
    seeds: str = typer.Option("0", "--seeds", help="comma-separated seeds, one column each"),
    steps: int = typer.Option(
        None, "--steps", help="Euler sampling steps (default: a distilled stage's own, else 20)"
    ),
    cfg: float = typer.Option(
        None, "--cfg", help="guidance scale, 0: off (default: 0 for a distilled stage, else 2)"
    ),
    expander: str = typer.Option(
        None,
        "--expander",
        help="OpenAI-compatible chat URL of a prompt expander (krea2 expander serve, vLLM), "
        "e.g. http://127.0.0.1:7450/v1: each prompt is expanded before sampling",
    ),
    style_ref: list[str] = typer.Option(
        None,
        "--style-ref",
        help="a style reference IMG[:STRENGTH] (repeatable; strength >= 0, default 1) for a "
        "style stage's module",
    ),
    style_times: str = typer.Option(
        None,
        "--style-times",
        help="LO:HI: the references act only while the flow time is in [LO, HI] (1 = noise), "
        "e.g. 0:0.8 keeps them out of the first steps (default: every step)",
    ),
    size: str = typer.Option(
        None,
        "--size",
        help="WIDTHxHEIGHT in pixels, e.g. 96x64 for a bucket that is not square (default: "
        "the stage's resolution, square)",
    ),
) -> None:
    """Sample a run's checkpoint with the run's own text conditioning, prediction type and
    time shift (what krea2 dit sample cannot rebuild, e.g. the toy's word table); writes
    OUT/grid.png with the prompts under each row, and one PNG per image. With
    ``--expander`` the rows are the expansions, and OUT/expansions.json maps each prompt
    to its expansion.

    With ``--style-ref`` (a stage trained with objective ``style``) every image takes its
    style from the references, each at its strength.

    Example: krea2 train sample runs/toy-pretrain --stage p32 --prompt "blob 3 in cell 4"
    --seeds 0,1 --steps 20 --out samples/
    """
    from krea2.dit import parse_size, parse_style_ref, parse_style_times
    from krea2.infra.errors import UserError
    from krea2.trainer.inference import sample_run

    refs = [parse_style_ref(spec) for spec in style_ref or []]
    times = parse_style_times(style_times) if style_times is not None else None
    wh = parse_size(size) if size else None
    try:
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        raise UserError(f"--seeds {seeds!r} must be comma-separated whole numbers") from None
    if step != "latest" and not step.isdigit():
        raise UserError(f"--step {step!r} must be a checkpoint step number or 'latest'")
    at = None if step == "latest" else int(step)
    if expander:
        import json

        from krea2.trainer.expand_client import expand_prompts
        from krea2.trainer.inference import load_run

        load_run(run_dir)  # a wrong run folder fails before any expansion is asked for
        expanded = expand_prompts(expander, prompt)
        out.mkdir(parents=True, exist_ok=True)
        pairs = [{"prompt": p, "expansion": e} for p, e in zip(prompt, expanded, strict=True)]
        (out / "expansions.json").write_text(json.dumps(pairs, indent=1))
        for p, e in zip(prompt, expanded, strict=True):
            typer.echo(f"{p!r} -> {e!r}")
        prompt = expanded
    grid = sample_run(run_dir, prompt, out, stage, at, seed_list, steps, cfg, refs, wh, times)
    typer.echo(f"wrote {len(prompt) * len(seed_list)} images and {grid}")
