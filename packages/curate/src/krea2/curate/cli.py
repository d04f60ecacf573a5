"""``krea2 curate``: ingest, run the curation jobs, report, export, and make ShapesWorld pools."""

from __future__ import annotations

from pathlib import Path

import typer

from krea2.curate import STAGE_NAMES

app = typer.Typer(
    help="Image curation on krablet: ingest, cheap filters, dedup, OCR, report, shard export."
    "\n\nExample: krea2 curate ingest ./photos && krea2 curate run && "
    "krea2 curate report --out report/",
    no_args_is_help=True,
)

CLUSTER_HELP = "Cluster file or comma-separated DSNs (default: $KRABLET_CLUSTER)."
CONFIG_HELP = "TOML file of curate settings (see docs/curate.md)."
SET_HELP = "Override a setting, e.g. --set stages.256.max_aspect=2.5 (repeatable)."


def _config(config: Path | None, overrides: list[str], stage: str | None):
    from dataclasses import replace

    from krea2.curate import CurateConfig
    from krea2.infra.config import load_config

    cfg = load_config(CurateConfig, config, overrides)
    cfg = replace(cfg, stage=stage) if stage else cfg
    cfg.thresholds()  # fail now, with the fix, on an unknown stage
    return cfg


@app.command()
def ingest(
    source: Path = typer.Argument(
        ..., help="A directory tree, a .parquet with a uri column, or a text file of URIs."
    ),
    name: str = typer.Option(None, help="Source name (key prefix); default: the path's stem."),
    all_files: bool = typer.Option(False, help="Take every file, not only image suffixes."),
    cluster: str = typer.Option(None, help=CLUSTER_HELP),
) -> None:
    """List SOURCE into the images table; bytes stay where they are (rows hold URIs).

    Re-ingesting is idempotent: keys are source/relative-path. In a directory, a sidecar
    <stem>.json next to an image (webdataset/img2dataset style) becomes the row's metadata.
    The per-file work (md5, size, format, decode, filters, hashes) is the `analyze` stage
    that `run` executes.

    Example: krea2 curate ingest ./photos --name photos --cluster /tmp/kb/cluster.json
    """
    from krea2 import curate

    wh = curate.open_warehouse(cluster)
    n = curate.ingest(wh, source, name, all_files)
    wh.close()
    typer.echo(f"ingested {n} images from {source} (run `krea2 curate run` to process them)")


def _run_with_progress(batch_size: int, lease_s: float | None, follow: bool):
    """A ``run_stages`` job runner: one worker on this process, with a progress bar."""

    def run_job(wh, stage, handler):
        import threading

        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        from krea2 import curate

        reader = wh.reader()
        todo, done = stage.progress_filters()
        stop = threading.Event()
        with Progress(
            "[bold]{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()
        ) as progress:
            task = progress.add_task(stage.name, total=reader.count(curate.TABLE, todo) or None)

            def poll() -> None:
                while not stop.wait(1.0):
                    progress.update(
                        task,
                        completed=reader.count(curate.TABLE, done),
                        total=reader.count(curate.TABLE, todo),
                    )

            t = threading.Thread(target=poll, daemon=True)
            t.start()
            stats = curate.run_worker(
                wh,
                stage,
                handler,
                batch_size=batch_size,
                lease_s=lease_s,
                follow=follow,
                install_signals=True,
                single_thread=True,  # one worker process per core
            )
            stop.set()
            t.join()
            progress.update(task, completed=reader.count(curate.TABLE, done))
        typer.echo(
            f"{stage.name}: {stats.completed} done, {stats.failed} failed (retried later), "
            f"{stats.released} released"
        )
        return stats

    return run_job


def _echo_pass_result(stage, result) -> None:
    if isinstance(result, dict):  # a pass's counts (a job's worker already reported)
        typer.echo(f"{stage.name}: {result}")


@app.command()
def run(
    stages: str = typer.Option(
        "analyze,dedup,ocr", help=f"Comma-separated, from {', '.join(STAGE_NAMES)}."
    ),
    tagger: str = typer.Option("none", help="Concept tagger of the tags stage, e.g. shapes."),
    captioner: str = typer.Option("none", help="Captioner of the captions stage, e.g. shapes."),
    processes: int = typer.Option(1, help="Isolated decode processes of the analyze job."),
    batch_size: int = typer.Option(32, help="Rows per claim."),
    lease_s: float = typer.Option(None, help="Lease length in s (default: the job's)."),
    follow: bool = typer.Option(False, help="Keep waiting for new rows instead of exiting."),
    stage: str = typer.Option(None, help="Resolution stage whose thresholds apply (256, 512…)."),
    config: Path = typer.Option(None, help=CONFIG_HELP),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
    cluster: str = typer.Option(None, help=CLUSTER_HELP),
) -> None:
    """Run curation stages in order: analyze → dedup → ocr → tags → concepts, captions.

    Jobs run as krablet workers (kill one at any time and rerun; nothing is lost), with
    progress; passes (dedup, concepts) recompute over the warehouse.

    Example: krea2 curate run --stages analyze,dedup,ocr,tags,concepts,captions
    --tagger shapes --captioner shapes
    """
    from krea2 import curate

    chosen = [s.strip() for s in stages.split(",") if s.strip()]
    curate.check_stages(chosen, tagger, captioner)  # before the warehouse is opened
    cfg = _config(config, set_, stage)
    wh = curate.open_warehouse(cluster)
    try:
        curate.run_stages(
            wh,
            chosen,
            cfg,
            tagger=tagger,
            captioner=captioner,
            processes=processes,
            run_job=_run_with_progress(batch_size, lease_s, follow),
            on_result=_echo_pass_result,
        )
    finally:
        wh.close()


def _labels(path: Path | None) -> dict[str, str]:
    """Ground truth from a pool's labels.jsonl, keyed by file name."""
    import json

    if path is None:
        return {}
    return {m["file"]: m["label"] for m in map(json.loads, path.read_text().splitlines())}


@app.command()
def report(
    out: Path = typer.Option(..., help="Directory for index.html and summary.json."),
    labels: Path = typer.Option(
        None, help="labels.jsonl of a ShapesWorld pool: adds precision/recall per defect class."
    ),
    examples: int = typer.Option(8, help="Example images per reason."),
    cluster: str = typer.Option(None, help=CLUSTER_HELP),
) -> None:
    """Write an HTML report: rejects per reason, score histograms, examples, duplicate groups.

    Example: krea2 curate report --out report/ --labels pool/labels.jsonl
    """
    from urllib.parse import unquote, urlparse

    from krea2 import curate

    wh = curate.open_warehouse(cluster)
    rows = curate.read_rows(wh)
    wh.close()
    by_file = _labels(labels)
    keyed = {
        r["image_key"]: by_file[n]
        for r in rows
        if (n := Path(unquote(urlparse(r["uri"] or "").path)).name) in by_file
    }
    summary = curate.write_report(rows, out, keyed or None, examples)
    typer.echo(
        f"report: {out / 'index.html'} ({summary['images']} images, "
        f"{summary['reasons'].get('kept', 0)} kept)"
    )


@app.command()
def export(
    out: Path = typer.Option(..., help="Directory for shard-NNNNN.parquet files."),
    side: int = typer.Option(256, help="Bucket side in px (buckets have about side² pixels)."),
    stage: str = typer.Option(None, help="Stage name recorded in the shards (default: side)."),
    seed: int = typer.Option(0, help="Shuffle seed."),
    batch_size: int = typer.Option(32, help="Rows per single-bucket batch."),
    rows_per_file: int = typer.Option(4096, help="Rows per Parquet file."),
    image_format: str = typer.Option("png", help="png or jpeg."),
    cluster: str = typer.Option(None, help=CLUSTER_HELP),
) -> None:
    """Export the kept images, with the captions the `captions` stage wrote to their rows,
    as pre-shuffled, bucket-packed training shards. Rows without captions are skipped.

    Example: krea2 curate export --out shards/ --side 64
    """
    from rich.progress import track

    from krea2 import curate

    wh = curate.open_warehouse(cluster)
    try:
        stats = curate.export_warehouse(
            wh,
            out,
            side,
            stage,
            seed,
            batch_size,
            rows_per_file,
            image_format,
            progress=lambda samples, n: track(samples, total=n, description="export"),
        )
    finally:
        wh.close()
    skipped = (
        f"; {stats.uncaptioned} kept rows skipped without captions "
        "(run `krea2 curate run --stages captions --captioner NAME`)"
        if stats.uncaptioned
        else ""
    )
    typer.echo(
        f"export: {stats.rows} rows in {stats.files} files under {out}; buckets "
        f"{stats.buckets}; {stats.dropped_tail} tail rows dropped, {stats.failed} failed"
        f"{skipped}"
    )


@app.command()
def pool(
    out: Path = typer.Option(..., help="Directory for the images and labels.jsonl."),
    seed: int = typer.Option(0, help="Generator seed."),
    clean: int = typer.Option(100, help="Clean scenes."),
    per_defect: int = typer.Option(10, help="Images per defect class."),
    overrepresented: int = typer.Option(30, help="Images of the over-represented concept."),
) -> None:
    """Write a ShapesWorld raw pool with injected defects and ground-truth labels; each
    scene's spec goes in a sidecar <stem>.json that ingest reads into the row's metadata.

    Example: krea2 curate pool --out /tmp/pool && krea2 curate ingest /tmp/pool --name pool
    """
    from krea2.curate import shapes

    items = shapes.make_pool(seed, clean, per_defect, overrepresented)
    labels = shapes.write_pool(items, out)
    typer.echo(f"pool: {len(items)} images under {out}, labels in {labels}")
