"""``krea2 rl`` commands of the preference part: make on-policy pairs from a trained run,
export pairs (a pairs.json or the annotated pairs table) as training shards, annotate them,
and train with DPO or STPO. The commands are thin: the work is the package's public API."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    """Add the preference commands to ``app`` (the ``krea2 rl`` typer app)."""
    app.command("make-pairs")(make_pairs_command)
    app.command("export-pairs")(export_pairs_command)
    app.command("train-preference")(train_preference_command)
    app.command("annotate")(annotate_command)


def train_preference_command(
    config: Path = typer.Option(..., "--config", "-c", help="trainer job TOML on pair shards"),
    objective: str = typer.Option("stpo", "--objective", help="stpo or dpo"),
    beta: float = typer.Option(5000.0, "--beta", help="DPO inverse temperature (per-pixel MSE)"),
    time_weight: str = typer.Option("uniform", "--time-weight", help="uniform or epsilon"),
    winner_hinge: float = typer.Option(1.0, "--winner-hinge", help="STPO λ_w"),
    loser_cap: float = typer.Option(0.1, "--loser-cap", help="STPO λ_l"),
    loser_margin: float = typer.Option(0.01, "--loser-margin", help="STPO m"),
    flow_weight: float = typer.Option(0.0, "--flow-weight", help="flow loss on the winner"),
    set_: list[str] = typer.Option([], "--set", help="job override, e.g. stages.0.steps=50"),
    resume: bool = typer.Option(False, "--resume", help="continue from the newest checkpoint"),
) -> None:
    """Preference-optimize a DiT on pair shards (krea2 rl export-pairs) with STPO or DPO.

    Example: krea2 rl train-preference --config configs/toy/preference.toml --objective dpo
    --set run_dir=runs/toy-preference-dpo
    """
    from krea2.infra.errors import UserError
    from krea2.rl.preference.loss import PreferenceConfig
    from krea2.rl.preference.train import train_preference

    try:
        pref = PreferenceConfig(
            objective, beta, time_weight, winner_hinge, loser_cap, loser_margin, flow_weight
        )
    except ValueError as exc:
        raise UserError(str(exc)) from None
    run = train_preference(config, pref, set_, resume)
    typer.echo(f"preference run finished: {run} (metrics.jsonl: winner_gap, loser_gap, margin)")


def annotate_command(
    cluster: str = typer.Option(None, "--cluster", help="krablet cluster file or DSNs"),
    table: str = typer.Option("preference_pairs", "--table", help="the pairs table"),
    pairs: Path = typer.Option(None, "--pairs", help="add a preference stage's pairs.json first"),
    images: Path = typer.Option(
        None, "--images", help="folder the page serves images from (default: --pairs' folder)"
    ),
    annotator: str = typer.Option(None, "--annotator", help="name recorded with each choice"),
    host: str = typer.Option("127.0.0.1", "--host", help="bind address (loopback by default)"),
    port: int = typer.Option(7450, "--port"),
    token: str = typer.Option(
        None, "--token", envvar="KREA2_ANNOTATE_TOKEN", help="needed off loopback"
    ),
    allow_host: list[str] = typer.Option(
        [], "--allow-host", help="another name the page is reached by (Host header)"
    ),
) -> None:
    """Serve a local page to choose the better image of each pair (← → s skip, u undo).

    Only image files (PNG, JPEG, WebP) under --images are served. A non-loopback --host needs
    --token (or KREA2_ANNOTATE_TOKEN); open http://HOST:PORT/?token=TOKEN once.

    Example: krea2 rl annotate --cluster kb/cluster.json --pairs work/pairs.json --port 7450
    """
    import uvicorn

    from krea2.infra.errors import UserError
    from krea2.rl.preference.annotate import TOKEN_ENV, AnnotationSession, annotate_app
    from krea2.rl.preference.shards import read_pairs_file
    from krea2.rl.preference.table import open_pairs, write_pairs
    from krea2.rl.serving import check_bind

    check_bind(host, token, "the annotation page", TOKEN_ENV)  # before the table is opened
    folder = images if images is not None else (pairs.parent if pairs is not None else None)
    if folder is None:
        raise UserError("give --images DIR: the folder holding the pairs' images (or --pairs FILE)")
    if not folder.is_dir():
        raise UserError(f"--images {folder} is not a folder")
    to_add = read_pairs_file(pairs) if pairs is not None else []
    wh = open_pairs(cluster, table)
    if pairs is not None:
        typer.echo(f"added {write_pairs(wh, to_add, table)} pairs to {table}")
    session = AnnotationSession(wh, table, annotator, images=folder)
    if hidden := session.unservable():
        typer.echo(
            f"warning: {len(hidden)} pairs (e.g. {hidden[0]}) have an image missing or outside "
            f"{folder}; the page shows no image for it",
            err=True,
        )
    app = annotate_app(session, host=host, port=port, token=token, allowed_hosts=allow_host)
    typer.echo(f"{len(session.pairs)} pairs to annotate: http://{host}:{port}/")
    uvicorn.run(app, host=host, port=port, log_level="warning")


def make_pairs_command(
    run_dir: Path = typer.Argument(..., help="a krea2 train run directory (holds config.toml)"),
    out: Path = typer.Option(..., "--out", help="new folder for pairs.json and images/"),
    stage: str = typer.Option(
        None, "--stage", help="stage to sample (default: the last one with a checkpoint)"
    ),
    prompts: Path = typer.Option(None, "--prompts", help="text file: one prompt a line"),
    shapes: int = typer.Option(
        0, "--shapes", help="N ShapesWorld prompts of the demo's training concepts instead"
    ),
    reward: str = typer.Option(
        "shapes",
        "--reward",
        help="shapes (ShapesWorld rubric + 0.5 x artifact), smooth (1 - high-frequency "
        "energy: ranks any model's samples) or a reward spec: rubric, artifact:PATH, ...",
    ),
    artifact_head: Path = typer.Option(
        None,
        "--artifact-head",
        help="--reward shapes: its artifact head (default OUT/artifact.npz)",
    ),
    samples_per_prompt: int = typer.Option(4, "--samples-per-prompt", help="images per prompt"),
    pairs_per_prompt: int = typer.Option(1, "--pairs-per-prompt", help="k-th best vs k-th worst"),
    seed: int = typer.Option(0, "--seed", help="first sampling seed (seeds SEED .. SEED+N-1)"),
    sample_steps: int = typer.Option(20, "--sample-steps", help="Euler sampling steps"),
    cfg: float = typer.Option(2.0, "--cfg", help="classifier-free guidance scale"),
    min_gap: float = typer.Option(0.0, "--min-gap", help="drop pairs whose scores differ less"),
) -> None:
    """Make on-policy pairs from a trained run: OUT/pairs.json + OUT/images/.

    The run's checkpoint samples N images per prompt (seeds SEED..), a reward ranks them,
    and the best and the worst of each prompt become a pair (ties give none). The pairs
    feed krea2 rl export-pairs (training shards) or krea2 rl annotate (people check them).
    --reward shapes trains its artifact head once (~10 s) at --artifact-head; a model too
    weak for it (a smoke run) ties every prompt's samples: --reward smooth ranks any model.

    Example: krea2 rl make-pairs runs/toy-pretrain --stage p32 --prompts prompts.txt
    --samples-per-prompt 4 --sample-steps 8 --out work/toy-pairs
    """
    from krea2.infra.errors import UserError
    from krea2.rl.preference.onpolicy import generate_pairs
    from krea2.rl.preference.shards import write_pairs_file
    from krea2.trainer.inference import load_run, pick_stage

    if samples_per_prompt < 2:
        raise UserError(f"--samples-per-prompt {samples_per_prompt}: a pair needs at least 2")
    if not 1 <= pairs_per_prompt <= samples_per_prompt // 2:
        raise UserError(
            f"--pairs-per-prompt {pairs_per_prompt} must be in 1..{samples_per_prompt // 2} "
            f"for {samples_per_prompt} samples per prompt (each sample in one pair at most)"
        )
    out = out.resolve()  # the pairs' file:// URIs are absolute: usable from any folder
    if (out / "pairs.json").exists():
        raise UserError(f"{out / 'pairs.json'} exists; use another --out (or delete it)")
    prompt_list = _prompt_list(prompts, shapes)
    job = load_run(run_dir)
    index = pick_stage(job, stage)
    scorer = _pair_reward(reward, artifact_head or out / "artifact.npz")
    pairs = generate_pairs(
        job, index, prompt_list, scorer, out / "images", samples_per_prompt=samples_per_prompt,
        seed=seed, steps=sample_steps, cfg_scale=cfg, min_gap=min_gap,
        pairs_per_prompt=pairs_per_prompt,
    )  # fmt: skip
    if not pairs:
        raise UserError(
            f"no pair: the reward {reward!r} scored the {samples_per_prompt} samples of each "
            f"of the {len(prompt_list)} prompts alike (within --min-gap {min_gap}); train "
            "the model longer, sample more (--samples-per-prompt) or use another --reward "
            "(smooth ranks any model's samples)"
        )
    settings = {
        "run_dir": str(Path(run_dir).resolve()), "stage": job.stages[index].name,
        "model_step": pairs[0].model_step, "reward": reward, "prompts": len(prompt_list),
        "samples_per_prompt": samples_per_prompt, "pairs_per_prompt": pairs_per_prompt,
        "seed": seed, "sample_steps": sample_steps, "cfg": cfg, "min_gap": min_gap,
    }  # fmt: skip
    path = write_pairs_file(out / "pairs.json", pairs, settings)
    typer.echo(
        f"wrote {len(pairs)} pairs of {len(prompt_list)} prompts to {path} "
        f"({len(prompt_list) * samples_per_prompt} images in {out / 'images'})"
    )


def _prompt_list(prompts: Path | None, shapes: int) -> list[str]:
    """The prompts of ``--prompts FILE`` (one a line; blank lines and ``#`` lines left out)
    or ``--shapes N`` (N of the demo's training-concept prompts, evenly spread)."""
    from krea2.infra.errors import UserError

    if (prompts is None) == (shapes <= 0):
        raise UserError("give the prompts: --prompts FILE (one a line) or --shapes N, not both")
    if prompts is not None:
        if not prompts.is_file():
            raise UserError(f"--prompts {prompts} does not exist")
        lines = [line.strip() for line in prompts.read_text().splitlines()]
        found = [line for line in lines if line and not line.startswith("#")]
        if not found:
            raise UserError(f"--prompts {prompts} holds no prompt (one a line)")
        return found
    from krea2.curate.shapes import eval_prompt, split_concepts
    from krea2.rl.preference.stage import spread

    split = split_concepts(0, 0.15)  # the demo's: held-out concepts stay out of training
    return spread([eval_prompt(c) for c in split.train], shapes)


def _pair_reward(spec: str, artifact_head: Path):  # type: ignore[no-untyped-def]
    """``shapes``: :func:`shapes_preference_reward` (its head at ``artifact_head``);
    ``smooth``: :class:`SmoothnessReward`; any other spec:
    :func:`krea2.rl.rewards.load_reward`."""
    from krea2.infra.errors import UserError

    if spec == "smooth":
        from krea2.rl.preference.measures import SmoothnessReward

        return SmoothnessReward()
    if spec == "shapes":
        from krea2.rl.preference.stage import shapes_preference_reward

        return shapes_preference_reward(artifact_head)
    from krea2.rl.rewards import load_reward

    try:
        return load_reward(spec)
    except ValueError as exc:
        raise UserError(f"--reward: {exc}") from None


def export_pairs_command(
    out: Path = typer.Option(..., "--out", help="folder for the pair shards (no shards yet)"),
    pairs: Path = typer.Option(None, "--pairs", help="a pairs.json (krea2 rl make-pairs)"),
    cluster: str = typer.Option(
        None, "--cluster", help="krablet cluster file or DSNs of the pairs table"
    ),
    table: str = typer.Option("preference_pairs", "--table", help="the pairs table"),
    side: int = typer.Option(None, "--side", help="image side in px (default: the first's)"),
    resize: bool = typer.Option(False, "--resize", help="resize images of another size"),
    annotated_only: bool = typer.Option(
        False, "--annotated-only", help="only the pairs a person chose (winner or loser)"
    ),
    seed: int = typer.Option(0, "--seed", help="order of the pairs (shuffled whole)"),
) -> None:
    """Write preference pairs as pair shards for krea2 rl train-preference.

    A pair is two rows, winner then loser, in one bucket of SIDE x SIDE px. The pairs come
    from --pairs (a pairs.json) or from the pairs table (--cluster, or $KRABLET_CLUSTER),
    where a person's choice in krea2 rl annotate orients each pair and skipped pairs are
    left out.

    Example: krea2 rl export-pairs --pairs work/toy-pairs/pairs.json --out data/toy-pairs
    --side 32
    """
    import os

    import numpy as np

    from krea2.infra.errors import UserError
    from krea2.rl.preference.shards import export_pair_shards, image_size, read_pairs_file

    if pairs is not None and cluster is not None:
        raise UserError("give --pairs FILE or --cluster CLUSTER, not both")
    if side is not None and side < 8:
        raise UserError(f"--side {side} must be at least 8 px")
    if out.is_dir() and any(out.glob("*.parquet")):
        raise UserError(f"{out} already holds shards; use another --out (or delete them)")
    if pairs is not None:
        found, where = read_pairs_file(pairs), str(pairs)
    elif cluster is None and not os.environ.get("KRABLET_CLUSTER"):
        raise UserError("give the pairs: --pairs FILE (a pairs.json) or --cluster CLUSTER")
    else:
        found, where = _table_pairs(cluster, table), f"table {table!r}"
    if not found:
        raise UserError(f"{where} holds no pair; make some with krea2 rl make-pairs")
    skipped = sum(p.choice == "skip" for p in found)
    unchosen = sum(p.choice is None for p in found) if annotated_only else 0
    kept = [p for p in found if p.choice != "skip" and (p.choice or not annotated_only)]
    if not kept:
        why = f"{skipped} skipped" + (f", {unchosen} not annotated" if unchosen else "")
        raise UserError(f"no pair left to export: of the {len(found)} in {where}, {why}")
    if side is None:
        w, h = image_size(kept[0].winner_uri, kept[0].pair_id, "winner")
        if w != h:
            raise UserError(
                f"pair {kept[0].pair_id!r}: its winner image is {w}x{h}, not square; "
                "pass --side N --resize"
            )
        side = w
    order = np.random.default_rng(seed).permutation(len(kept))
    files = export_pair_shards([kept[i] for i in order], out, side, seed, resize=resize)
    flipped = sum(p.choice == "loser" for p in kept)
    left = [f"{skipped} skipped"] + ([f"{unchosen} not annotated"] if annotated_only else [])
    typer.echo(
        f"wrote {len(kept)} pairs ({2 * len(kept)} images, {side}x{side}) to "
        f"{', '.join(map(str, files))}; left out {', '.join(left)}; "
        f"{flipped} flipped by a person's choice (train with batch_size <= {2 * len(kept)})"
    )


def _table_pairs(cluster: str | None, table: str) -> list:
    """All pairs of the pairs table ``table`` in insertion order."""
    from krea2.rl.preference.table import open_pairs, read_pairs

    with open_pairs(cluster, table) as wh:
        return read_pairs(wh, table)
