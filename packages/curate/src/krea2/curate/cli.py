"""``krea2 curate``: ingest, run the curation jobs, report, export, and make ShapesWorld pools."""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(
    help="Image curation on krablet: ingest, cheap filters, dedup, OCR, report, shard export."
    "\n\nExample: krea2 curate ingest ./photos && krea2 curate run && "
    "krea2 curate report --out report/",
    no_args_is_help=True,
)

CLUSTER_HELP = "Cluster file or comma-separated DSNs (default: $KRABLET_CLUSTER)."
CONFIG_HELP = "TOML file of curate settings (see docs/curate.md)."
SET_HELP = "Override a setting, e.g. --set stages.256.max_aspect=2.5 (repeatable)."
STAGES = ("analyze", "dedup", "ocr", "tags", "concepts")


def _config(config: Path | None, overrides: list[str], stage: str | None):
    from krea2.curate.config import CurateConfig
    from krea2.curate.jobs import with_stage
    from krea2.infra.config import load_config

    cfg = with_stage(load_config(CurateConfig, config, overrides), stage)
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

    Re-ingesting is idempotent: keys are source/relative-path. The per-file work (md5, size,
    format, decode, filters, hashes) is the `analyze` job that `run` executes.

    Example: krea2 curate ingest ./photos --name photos --cluster /tmp/kb/cluster.json
    """
    from krea2.curate.ingest import list_source
    from krea2.curate.jobs import ingest_rows, open_warehouse

    wh = open_warehouse(cluster)
    n = ingest_rows(wh, list_source(source, name, all_files))
    wh.close()
    typer.echo(f"ingested {n} images from {source} (run `krea2 curate run` to process them)")


def _run_worker(wh, job: str, handler, batch_size: int, lease_s: float | None, follow: bool):
    import threading

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from krea2.curate.jobs import TABLE
    from krea2.curate.threads import single_threaded
    from krea2.krablet import Worker

    single_threaded()  # one worker process per core

    j = wh.table(TABLE).job(job)
    reader = wh.reader()
    where_done = [[j.done_column, "is not", None]]
    total_where = {
        "analyze": [],
        "ocr": [["dup_keep", "is", True]],
        "tags": [["text_reject", "=", ""]],
    }[job]
    worker = Worker(wh, TABLE, job, handler, batch_size=batch_size, lease_s=lease_s)
    stop = threading.Event()

    with Progress(
        "[bold]{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()
    ) as progress:
        task = progress.add_task(job, total=reader.count(TABLE, total_where) or None)

        def poll() -> None:
            while not stop.wait(1.0):
                progress.update(
                    task,
                    completed=reader.count(TABLE, total_where + where_done),
                    total=reader.count(TABLE, total_where),
                )

        t = threading.Thread(target=poll, daemon=True)
        t.start()
        stats = worker.run(until_empty=not follow, install_signals=True)
        stop.set()
        t.join()
        progress.update(task, completed=reader.count(TABLE, total_where + where_done))
    typer.echo(
        f"{job}: {stats.completed} done, {stats.failed} failed (retried later), "
        f"{stats.released} released"
    )


@app.command()
def run(
    stages: str = typer.Option("analyze,dedup,ocr", help=f"Comma-separated, from {STAGES}."),
    tagger: str = typer.Option("none", help="Concept tagger for tags/concepts: none or shapes."),
    processes: int = typer.Option(1, help="Isolated decode processes of the analyze job."),
    batch_size: int = typer.Option(32, help="Rows per claim."),
    lease_s: float = typer.Option(None, help="Lease length in s (default: the job's)."),
    follow: bool = typer.Option(False, help="Keep waiting for new rows instead of exiting."),
    stage: str = typer.Option(None, help="Resolution stage whose thresholds apply (256, 512…)."),
    config: Path = typer.Option(None, help=CONFIG_HELP),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
    cluster: str = typer.Option(None, help=CLUSTER_HELP),
) -> None:
    """Run the curation DAG: analyze → dedup → ocr (→ tags → concepts), with progress.

    Workers are krablet workers: kill one at any time and rerun; nothing is lost.

    Example: krea2 curate run --stages analyze,dedup,ocr,tags,concepts --tagger shapes
    """
    from krea2.curate import jobs
    from krea2.infra.errors import UserError

    chosen = [s.strip() for s in stages.split(",") if s.strip()]
    bad = [s for s in chosen if s not in STAGES]
    if bad:
        raise UserError(f"unknown stage(s) {bad}; choose from {list(STAGES)}")
    if tagger not in ("none", "shapes"):
        raise UserError(f"--tagger {tagger!r}: use 'none' or 'shapes'")
    if "tags" in chosen and tagger == "none":
        raise UserError("the tags stage needs a tagger: pass --tagger shapes")
    cfg = _config(config, set_, stage)
    wh = jobs.open_warehouse(cluster)
    for s in chosen:
        if s == "analyze":
            h = jobs.configured(jobs.AnalyzeHandler, cfg, processes=processes)
            _run_worker(wh, "analyze", h, batch_size, lease_s, follow)
        elif s == "dedup":
            typer.echo(f"dedup: {jobs.dedup_pass(wh, cfg)}")
        elif s == "ocr":
            _run_worker(
                wh, "ocr", jobs.configured(jobs.OcrHandler, cfg), batch_size, lease_s, follow
            )
        elif s == "tags":
            h = jobs.configured(jobs.ShapesTagHandler, cfg)
            _run_worker(wh, "tags", h, batch_size, lease_s, follow)
        else:
            typer.echo(f"concepts: {jobs.concept_pass(wh, cfg)}")
    wh.close()


def _labels(path: Path | None) -> dict[str, str]:
    """Ground truth from a pool's labels.jsonl, keyed by file name."""
    import json

    if path is None:
        return {}
    return {m["file"]: m["label"] for m in map(json.loads, path.read_text().splitlines())}


def _all_rows(wh) -> list[dict]:
    from krea2.curate.jobs import TABLE, scan_all

    cols = [c for c in wh.table(TABLE).all_columns if c not in ("phash8", "phash12", "colorhash")]
    return list(scan_all(wh, [], cols))


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

    from krea2.curate.decode import DecodeError, DecodeLimits, decode
    from krea2.curate.jobs import final_reason, open_warehouse
    from krea2.curate.report import build_report
    from krea2.curate.storage import read_uri

    def thumb(uri: str):
        try:
            return decode(read_uri(uri), DecodeLimits(analysis_size=128)).pixels
        except (OSError, DecodeError):
            return None

    wh = open_warehouse(cluster)
    rows = _all_rows(wh)
    wh.close()
    by_file = _labels(labels)
    keyed = {
        r["image_key"]: by_file[n]
        for r in rows
        if (n := Path(unquote(urlparse(r["uri"] or "").path)).name) in by_file
    }
    summary = build_report(rows, out, thumb, final_reason, keyed or None, examples)
    typer.echo(
        f"report: {out / 'index.html'} ({summary['images']} images, "
        f"{summary['reasons'].get('kept', 0)} kept)"
    )


@app.command()
def export(
    out: Path = typer.Option(..., help="Directory for shard-NNNNN.parquet files."),
    side: int = typer.Option(256, help="Bucket side in px (buckets have about side² pixels)."),
    stage: str = typer.Option(None, help="Stage name recorded in the shards (default: side)."),
    captions: Path = typer.Option(
        None,
        help="JSONL with `file` and `scene` (ShapesWorld) or "
        "`captions` per image; images without captions are skipped.",
    ),
    seed: int = typer.Option(0, help="Shuffle seed."),
    batch_size: int = typer.Option(32, help="Rows per single-bucket batch."),
    rows_per_file: int = typer.Option(4096, help="Rows per Parquet file."),
    image_format: str = typer.Option("png", help="png or jpeg."),
    cluster: str = typer.Option(None, help=CLUSTER_HELP),
) -> None:
    """Export the kept images as pre-shuffled, bucket-packed training shards.

    Example: krea2 curate export --out shards/ --side 64 --captions pool/labels.jsonl
    """
    import json
    from urllib.parse import unquote, urlparse

    from krea2.curate.export import Sample, export_shards
    from krea2.curate.jobs import final_reason, open_warehouse
    from krea2.curate.shapes import Scene
    from krea2.curate.shapes import captions as scene_captions
    from krea2.curate.storage import read_uri

    caps: dict[str, tuple[dict, dict]] = {}
    if captions is not None:
        for m in map(json.loads, captions.read_text().splitlines()):
            if m.get("scene"):
                caps[m["file"]] = (
                    scene_captions(Scene.from_dict(m["scene"])),
                    {"scene": m["scene"]},
                )
            elif m.get("captions"):
                caps[m["file"]] = (m["captions"], {})
    wh = open_warehouse(cluster)
    rows = [r for r in _all_rows(wh) if final_reason(r) is None and r.get("md5")]
    wh.close()

    def samples():
        for r in rows:
            name = Path(unquote(urlparse(r["uri"]).path)).name
            if name not in caps:
                continue
            text, meta = caps[name]
            meta = meta | {"source": r["source"], "md5": r["md5"]}
            yield Sample(r["image_key"], read_uri(r["uri"]), text, r["uri"], meta)

    from rich.progress import track

    todo = track(samples(), total=len(rows), description="export")
    stats = export_shards(
        todo, out, stage or str(side), side, seed, batch_size, rows_per_file, image_format
    )
    typer.echo(
        f"export: {stats.rows} rows in {stats.files} files under {out}; buckets "
        f"{stats.buckets}; {stats.dropped_tail} tail rows dropped, {stats.failed} failed"
    )


@app.command()
def pool(
    out: Path = typer.Option(..., help="Directory for the images and labels.jsonl."),
    seed: int = typer.Option(0, help="Generator seed."),
    clean: int = typer.Option(100, help="Clean scenes."),
    per_defect: int = typer.Option(10, help="Images per defect class."),
    overrepresented: int = typer.Option(30, help="Images of the over-represented concept."),
) -> None:
    """Write a ShapesWorld raw pool with injected defects and ground-truth labels.

    Example: krea2 curate pool --out /tmp/pool && krea2 curate ingest /tmp/pool --name pool
    """
    from krea2.curate.shapes.defects import make_pool, write_pool

    items = make_pool(seed, clean, per_defect, overrepresented)
    labels = write_pool(items, out)
    typer.echo(f"pool: {len(items)} images under {out}, labels in {labels}")
