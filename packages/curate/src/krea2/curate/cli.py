"""``krea2 curate``: ingest, run the curation jobs, report, export, and make ShapesWorld pools."""

from __future__ import annotations

from pathlib import Path

import typer

import krea2.curate.cli_embed as cli_embed
from krea2.curate.cli_help import CLUSTER_HELP, CONFIG_HELP, SET_HELP
from krea2.curate.stages import STAGE_NAMES

app = typer.Typer(
    help="Image curation on krablet: ingest, cheap filters, dedup, OCR, report, shard export."
    "\n\nExample: krea2 curate ingest ./photos && krea2 curate run && "
    "krea2 curate report --out report/",
    no_args_is_help=True,
)


@app.command()
def ingest(
    source: Path = typer.Argument(
        ..., help="A directory tree, a .parquet with a uri column, or a text file of URIs."
    ),
    name: str = typer.Option(None, help="Source name (key prefix); default: the path's stem."),
    all_files: bool = typer.Option(False, help="Take every file, not only image suffixes."),
    verbose: bool = typer.Option(False, "--verbose", help="Name every file skipped."),
    cluster: str = typer.Option(None, help=CLUSTER_HELP),
) -> None:
    """List SOURCE into the images table; bytes stay where they are (rows hold URIs).

    Re-ingesting is idempotent: keys are source/relative-path. In a directory, sidecars
    beside an image become the row's metadata: <stem>.json (any metadata; captions under
    "caption" or "captions") and <stem>.txt (the caption). An image whose sidecars changed
    since the last ingest is queued again for the captions stage. Files that are not
    images (or are images curate does not decode, such as SVG) are counted by suffix and
    reason. The per-file work (md5, size, format, decode, filters, hashes) is the
    `analyze` stage that `run` executes.

    Example: krea2 curate ingest photos --name photos
    """
    from krea2 import curate

    wh = curate.open_warehouse(cluster)
    try:
        result = curate.ingest(wh, source, name, all_files)
    finally:
        wh.close()
    for line in result.lines(source, verbose):
        typer.echo(line)


def _run_with_progress(batch_size: int, lease_s: float | None, follow: bool):
    """A ``run_stages`` job runner: one worker on this process, with progress; it prints the
    worker's counts (and, for analyze, the images given up on for time or a crash) and
    stops the run at an interrupted job."""

    def run_job(wh, stage, handler):
        import signal
        import threading

        from krea2 import curate
        from krea2.infra.progress import progress

        reader = wh.reader()
        todo, done = stage.progress_filters()
        stop = threading.Event()
        with progress(stage.name, reader.count(curate.TABLE, todo) or None, unit="img") as bar:

            def poll() -> None:
                while not stop.wait(1.0):
                    bar.update(
                        reader.count(curate.TABLE, done), total=reader.count(curate.TABLE, todo)
                    )

            t = threading.Thread(target=poll, daemon=True)
            t.start()
            handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:  # the worker's own handlers: finish the batch, release the rest
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
            finally:
                for sig, previous in handlers.items():
                    signal.signal(sig, previous)
                stop.set()
                t.join()
            bar.update(reader.count(curate.TABLE, done))
        line = (
            f"{stage.name}: {stats.completed} done, {stats.failed} failed (retried later), "
            f"{stats.released} released"
        )
        if skipped := curate.skipped_rows(wh, stage):
            line += (
                f"; {skipped} skipped, with nothing to caption until their inputs change "
                "(add sidecars and ingest again)"
            )
        if stage.name == "analyze":
            gave_up = curate.isolation_failures(wh)
            line += f"; {gave_up} timed out or crashed twice (marked broken)" + (
                "; `krea2 curate run --stages analyze --retry-timeouts` runs them again"
                if gave_up
                else ""
            )
        typer.echo(line)
        if stats.interrupted or stats.stopped_by is not None:
            raise _Interrupted(stats.stopped_by or signal.SIGINT)
        return stats

    return run_job


class _Interrupted(Exception):
    """A job's worker was stopped by signal ``signum`` (the run stops there)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


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
    embedder: str = typer.Option(
        "none", help="Model of the embed stage: siglip2:DIR, dinov3:DIR, sscd:FILE or toy:DIR."
    ),
    heads: str = typer.Option("none", help="Head JSON files of the classify stage (a,b)."),
    processes: int = typer.Option(1, help="Isolated decode processes of the analyze job."),
    batch_size: int = typer.Option(32, help="Rows per claim."),
    lease_s: float = typer.Option(None, help="Lease length in s (default: the job's)."),
    follow: bool = typer.Option(False, help="Keep waiting for new rows instead of exiting."),
    retry_timeouts: bool = typer.Option(
        False, help="First queue again the images analyze gave up on (timed out or crashed)."
    ),
    stage: str = typer.Option(None, help="Resolution stage whose thresholds apply (256, 512…)."),
    config: Path = typer.Option(None, help=CONFIG_HELP),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
    cluster: str = typer.Option(None, help=CLUSTER_HELP),
) -> None:
    """Run curation stages in order: analyze → dedup → ocr → tags → concepts, captions;
    embed → semantic (embedding-level dedup, needs --embedder and the `embed` extra).

    Jobs run as krablet workers (kill one at any time and rerun; nothing is lost), with
    progress; passes (dedup, concepts) recompute over the warehouse. Stopped by Ctrl-C or
    SIGTERM with work left, it prints how far each stage got and exits 130 or 143; a rerun
    resumes.

    Example: krea2 curate run --stages analyze,dedup --set stages.256.max_aspect=2.5
    """
    import signal

    from krea2 import curate
    from krea2.curate.config import load_curate_config

    chosen = [s.strip() for s in stages.split(",") if s.strip()]
    curate.check_stages(chosen, tagger, captioner, embedder, heads)  # before the warehouse opens
    cfg = load_curate_config(config, set_, stage)
    wh = curate.open_warehouse(cluster)
    try:
        if retry_timeouts:
            typer.echo(f"analyze: {curate.retry_isolation_failures(wh)} images queued again")
        curate.run_stages(
            wh,
            chosen,
            cfg,
            tagger=tagger,
            captioner=captioner,
            embedder=embedder,
            heads=heads,
            processes=processes,
            run_job=_run_with_progress(batch_size, lease_s, follow),
            on_result=_echo_pass_result,
        )
    except _Interrupted as stopped:
        progress = curate.stage_progress(wh, chosen)
        for name, (done, total) in progress.items():
            typer.echo(f"  {name}: {done} of {total} rows done")
        if all(done == total for done, total in progress.values()):
            return  # stopped, but nothing was left to do
        typer.echo("stopped with work left; rerun the same command to resume")
        if stopped.signum == signal.SIGTERM:
            typer.secho("interrupted", err=True, fg="yellow")
            raise typer.Exit(128 + signal.SIGTERM) from None
        raise typer.Exit(130) from None  # the host prints `interrupted`
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
    batch_size: int = typer.Option(
        None, help="Rows per single-bucket batch (default: 32, smaller for a small set)."
    ),
    rows_per_file: int = typer.Option(4096, help="Rows per Parquet file."),
    image_format: str = typer.Option("png", help="png or jpeg."),
    cluster: str = typer.Option(None, help=CLUSTER_HELP),
) -> None:
    """Export the kept images, with the captions the `captions` stage wrote to their rows,
    as pre-shuffled, bucket-packed training shards. Rows without captions are skipped; the
    summary says why any kept image was not written and what to change. OUT must be new,
    empty or hold an earlier export, whose files are replaced (krea2-export.json lists them).

    Example: krea2 curate export --out shards/ --side 64
    """
    from krea2 import curate
    from krea2.infra.progress import track

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
            progress=lambda samples, n: track(samples, "export", total=n, unit="img"),
        )
    finally:
        wh.close()
    typer.echo(
        f"export: {stats.rows} rows in {stats.files} files under {out} (batches of "
        f"{stats.batch_size}); buckets {stats.buckets}"
    )
    typer.echo(f"  {stats.folder}")
    for line in stats.shortfall():
        typer.echo(f"  {line}")


@app.command()
def pool(
    out: Path = typer.Option(..., help="Directory for the images and labels.jsonl."),
    seed: int = typer.Option(0, help="Generator seed."),
    clean: int = typer.Option(100, help="Clean scenes."),
    per_defect: int = typer.Option(10, help="Images per defect class."),
    overrepresented: int = typer.Option(30, help="Images of the over-represented concept."),
    copies: int = typer.Option(
        0, help="Copies hashes miss (crops >5%, flips, tone, blur): label semantic_duplicate."
    ),
) -> None:
    """Write a ShapesWorld raw pool with injected defects and ground-truth labels; each
    scene's spec goes in a sidecar <stem>.json that ingest reads into the row's metadata.

    Example: krea2 curate pool --out pool --clean 20 --per-defect 2
    """
    import krea2.curate.shapes as shapes

    items = shapes.make_pool(seed, clean, per_defect, overrepresented, n_copies=copies)
    labels = shapes.write_pool(items, out)
    typer.echo(f"pool: {len(items)} images under {out}, labels in {labels}")


# Embedding-level commands (curate part 2) live in their own module; registered here.
app.command("train-encoder")(cli_embed.train_encoder)
app.command()(cli_embed.clusters)
app.command("name-clusters")(cli_embed.name_clusters)
app.command()(cli_embed.review)
app.command("caption-server")(cli_embed.caption_server)
app.command()(cli_embed.nearest)
