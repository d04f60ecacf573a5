"""``krea2 curate`` commands of embedding-level curation: train the toy encoder, list and
review the k-means clusters (registered on the ``krea2 curate`` app by ``cli``)."""

from __future__ import annotations

from pathlib import Path

import typer

from krea2.curate.cli_help import CLUSTER_HELP, CONFIG_HELP, SET_HELP


def train_encoder(
    out: Path = typer.Option(..., help="Directory for config.json and model.safetensors."),
    steps: int = typer.Option(600, help="Training steps (batches of 128 images, 2 views each)."),
    max_images: int = typer.Option(20000, help="Train on at most this many hash keepers."),
    seed: int = typer.Option(0, help="Sampling and initialisation seed."),
    threads: int = typer.Option(1, help="Torch threads."),
    flips: bool = typer.Option(
        True, help="Count a mirrored image as a copy (--no-flips where position matters)."
    ),
    cluster: str = typer.Option(None, help=CLUSTER_HELP),
) -> None:
    """Train the toy image encoder self-supervised on the pool's hash keepers (rows the dedup
    stage kept; no labels), calibrate its copy threshold, and save it for
    `--embedder toy:OUT` (needs the `embed` extra).

    Example: krea2 curate train-encoder --out toy-encoder --steps 2
    """
    import numpy as np

    from krea2 import curate
    from krea2.curate.decode import DecodeError, decode
    from krea2.curate.embed import SslConfig, save_toy_encoder, train_toy_encoder
    from krea2.curate.storage import read_uri
    from krea2.infra.errors import UserError

    wh = curate.open_warehouse(cluster)
    try:
        rows = [r for r in curate.read_rows(wh, ["uri", "dup_keep"]) if r["dup_keep"]]
        rows.sort(key=lambda r: r["uri"])  # the sample must not depend on the shards' order
    finally:
        wh.close()
    if len(rows) < 2:
        raise UserError(
            "train-encoder needs hash keepers: run `krea2 curate run --stages analyze,dedup` first"
        )
    pick = np.random.default_rng(seed).permutation(len(rows))[:max_images]
    images = []
    for i in sorted(pick):
        try:
            images.append(decode(read_uri(rows[i]["uri"])).pixels)
        except (OSError, DecodeError):
            continue  # an unreadable keeper is the embed job's to report
    config = SslConfig(steps=steps, seed=seed, threads=threads, flips=flips)
    model, stats = train_toy_encoder(images, config=config)
    save_toy_encoder(model, out)
    typer.echo(
        f"toy encoder: {len(images)} images, {steps} steps in {stats['seconds']:.0f} s, "
        f"copy threshold {stats['threshold']:.3f}; saved to {out} "
        f"(use --embedder toy:{out})"
    )


def clusters(
    flagged: bool = typer.Option(False, help="Only clusters flagged for review."),
    pending: bool = typer.Option(False, help="Only flagged clusters without a decision yet."),
    cluster: str = typer.Option(None, help=CLUSTER_HELP),
) -> None:
    """List the k-means clusters the semantic stage recorded: path (top level first), level,
    size, name, flag and decision. Flags come from the semantic pass (oversized leaves), the
    VLM namer (`krea2 curate name-clusters`) or `krea2 curate review --flag`.

    Example: krea2 curate clusters --pending
    """
    from krea2 import curate
    from krea2.curate.review import list_clusters

    wh = curate.open_warehouse(cluster)
    try:
        rows = list_clusters(wh, flagged or pending)
    finally:
        wh.close()
    if pending:
        rows = [r for r in rows if not r["decision"]]
    kind = "pending " if pending else "flagged " if flagged else ""
    typer.echo(f"{len(rows)} {kind}clusters")
    for r in rows:
        extra = "  ".join(f"{k}: {r[k]}" for k in ("name", "flag", "decision", "note") if r[k])
        typer.echo(f"  {r['cluster']:<12} level {r['level']}  {r['size']:>7} rows  {extra}")


def name_clusters(
    url: str = typer.Option(..., help="Base URL of an OpenAI-compatible VLM server (vLLM)."),
    model: str = typer.Option("default", help="Model name sent to the server."),
    level: int = typer.Option(1, help="Hierarchy level to name (1 = top; the leaves are last)."),
    per_group: int = typer.Option(4, help="Images nearest each centroid shown to the VLM."),
    retries: int = typer.Option(3, help="Retries per request (refused, timeout, 429, 5xx)."),
    timeout_s: float = typer.Option(60.0, help="Seconds per request."),
    concurrency: int = typer.Option(4, help="Requests in flight."),
    cluster: str = typer.Option(None, help=CLUSTER_HELP),
) -> None:
    """Name every k-means cluster at LEVEL from the images nearest its centroid, through a
    VLM behind an OpenAI-compatible API; names go into the review queue (the `clusters`
    table) and the VLM's reason to look becomes the cluster's flag (`vlm: ...`) unless it is
    flagged already. Then `krea2 curate clusters --pending` lists what awaits a decision and
    `krea2 curate review PATH --decision keep|drop` records one. A cluster whose request
    fails keeps no name (rerun to try again).

    Example: krea2 curate name-clusters --url http://127.0.0.1:8000 --level 2
    """
    from krea2 import curate
    from krea2.curate.naming import name_clusters as name_all
    from krea2.curate.vlm import VlmClient

    client = VlmClient(url, model, timeout_s=timeout_s, retries=retries, concurrency=concurrency)
    wh = curate.open_warehouse(cluster)
    try:
        result = name_all(wh, client, level, per_group)
    finally:
        wh.close()
        client.close()
    typer.echo(
        f"level {level}: {result['named']} of {result['clusters']} clusters named, "
        f"{result['flagged']} flagged by the VLM, {result['failed']} failed"
        + (" (rerun to retry them)" if result["failed"] else "")
    )
    if result["flagged"]:
        typer.echo("review them: krea2 curate clusters --pending")


def review(
    path: str = typer.Argument(..., help="Cluster path as listed by `clusters`, e.g. 2/17."),
    decision: str = typer.Option(None, help="keep, drop, or '' to reopen."),
    flag: str = typer.Option(None, help="Flag the cluster for review with this reason."),
    name: str = typer.Option(None, help="Name the cluster (with --flag)."),
    note: str = typer.Option("", help="Reviewer's note (with --decision)."),
    cluster: str = typer.Option(None, help=CLUSTER_HELP),
) -> None:
    """Flag a cluster or record a decision on it, then apply every decision to the rows (the
    `review` pass: rows of a dropped cluster get reject reason cluster_review).

    Example: krea2 curate review 0 --flag "check: one concept dominates" --name shapes
    """
    from krea2 import curate
    from krea2.curate.review import decide_cluster, flag_cluster, review_pass
    from krea2.infra.errors import UserError

    if decision is None and flag is None:
        raise UserError("give --decision keep|drop or --flag REASON")
    wh = curate.open_warehouse(cluster)
    try:
        if flag is not None:
            flag_cluster(wh, path, flag, name)
        if decision is not None:
            decide_cluster(wh, path, decision, note)
        result = review_pass(wh)
    finally:
        wh.close()
    typer.echo(f"cluster {path}: recorded; review: {result}")


def caption_server(
    port: int = typer.Option(8000, help="Port on 127.0.0.1 (0: any free port)."),
    omit_color: list[str] = typer.Option([], help="A colour the toy VLM never names (fault)."),
    seconds: float = typer.Option(0.0, help="Stop after this long (0: at Ctrl-C)."),
) -> None:
    """Serve ShapesWorld's deterministic captioner behind an OpenAI-compatible API (a toy
    VLM and rewriting LLM at /v1/chat/completions), for `krea2 curate run --stages
    captions,caption_check --captioner vlm --set captions.vlm_url=URL`.

    Example: krea2 curate caption-server --port 0 --omit-color red --seconds 0.1
    """
    import time

    from krea2.curate.shapes.caption_server import start_caption_server

    server, url = start_caption_server(port=port, omit_colors=frozenset(omit_color))
    typer.echo(f"toy captioner at {url}/v1/chat/completions")
    try:
        end = time.monotonic() + seconds if seconds > 0 else None
        while end is None or time.monotonic() < end:
            time.sleep(max(0.0, min(3600.0, end - time.monotonic())) if end else 3600.0)
    finally:
        server.shutdown()


def nearest(
    key: str = typer.Argument(None, help="A row's image_key: find the rows nearest its vector."),
    image: Path = typer.Option(None, help="Or an image file, embedded with --embedder."),
    embedder: str = typer.Option(
        None, help="KIND:PATH of the embedder the vectors stage stored (with --image)."
    ),
    k: int = typer.Option(10, help="How many rows to return."),
    config: Path = typer.Option(None, help=CONFIG_HELP),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
    cluster: str = typer.Option(None, help=CLUSTER_HELP),
) -> None:
    """Retrieval: the K rows whose embeddings are nearest by cosine, from pgvector (the
    `vectors` stage copies the embed stage's vectors there, with an HNSW index by default;
    `--set vectors.ef_search=200` searches wider). Prints similarity, key and URI.

    Example: krea2 curate nearest pool/00000-clean-00015.jpg --k 5
    """
    from krea2 import curate
    from krea2.curate.config import load_curate_config
    from krea2.curate.vectors import nearest as query_nearest
    from krea2.curate.vectors import stored_vector
    from krea2.infra.errors import UserError

    if (key is None) == (image is None):
        raise UserError("give a row key or --image FILE (with --embedder KIND:PATH), not both")
    cfg = load_curate_config(config, set_)
    if image is not None:
        if not embedder:
            raise UserError("--image needs --embedder KIND:PATH (the one the vectors stage stored)")
        query = _embed_file(image, embedder, cfg)
    wh = curate.open_warehouse(cluster)
    try:
        if key is not None:
            query = stored_vector(wh, key)
        found = query_nearest(wh, query, k, cfg.vectors)
    finally:
        wh.close()
    typer.echo(f"{len(found)} nearest of {key or image}")
    for n in found:
        typer.echo(f"  {n.similarity:.4f}  {n.image_key}  {n.uri or ''}")


def _embed_file(path: Path, spec: str, cfg: object) -> object:
    """``path``'s image embedded as the embed job does (the same decode, the same model)."""
    from krea2.curate.decode import DecodeError, decode
    from krea2.curate.embed.loaders import load_embedder
    from krea2.curate.image_analysis import decode_limits
    from krea2.curate.plugins import check_embedder
    from krea2.infra.errors import UserError

    check_embedder(spec, needed_by="nearest")
    try:
        pixels = decode(path.read_bytes(), decode_limits(cfg)).pixels
    except (OSError, DecodeError) as exc:
        raise UserError(f"--image {path}: cannot read it as an image ({exc})") from None
    e = cfg.embed
    return load_embedder(spec, e.device, e.dtype, 1).embed([pixels])[0]
