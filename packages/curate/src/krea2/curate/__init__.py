"""krea2.curate: image curation on krablet, and ShapesWorld (``krea2.curate.shapes``).

>>> from krea2 import curate
>>> wh = curate.open_warehouse("/tmp/kb/cluster.json")
>>> curate.ingest(wh, Path("/tmp/pool"), "pool")
>>> curate.run_stages(wh, curate.STAGE_NAMES, tagger="shapes", captioner="shapes")
>>> curate.export_warehouse(wh, Path("/tmp/shards"), side=64)

Names are imported on first use (the CLI imports this package; numba, OpenCV and the
warehouse client load only when needed).
"""

from __future__ import annotations

from krea2.infra.lazy import lazy_exports

__version__ = "0.1.0"

_PUBLIC: dict[str, str] = {
    # the warehouse: open, ingest, run, read
    "open_warehouse": "warehouse",
    "ingest": "warehouse",
    "ingest_rows": "warehouse",
    "IngestResult": "warehouse",
    "requeue": "warehouse",
    "run_stages": "warehouse",
    "check_stages": "warehouse",
    "run_worker": "warehouse",
    "read_rows": "warehouse",
    "kept_rows": "warehouse",
    "stage_progress": "warehouse",
    "skipped_rows": "warehouse",
    "is_complete": "warehouse",
    "isolation_failures": "warehouse",
    "retry_isolation_failures": "warehouse",
    # the DAG's declaration
    "STAGES": "stages",
    "STAGE_NAMES": "stages",
    "Stage": "stages",
    "StageKind": "stages",
    "TABLE": "stages",
    "final_reason": "stages",
    "images_table": "stages",
    # pluggable taggers and captioners
    "Tagger": "plugins",
    "Captioner": "plugins",
    "register_tagger": "plugins",
    "register_captioner": "plugins",
    "NoCaption": "plugins",
    # export and report
    "export_warehouse": "export",
    "export_shards": "export",
    "stage_buckets": "export",
    "Sample": "export",
    "ExportStats": "export",
    # a user's folder of captioned images -> shards (krea2 train prepare)
    "prepare_folder": "prepare",
    "PrepareResult": "prepare",
    "read_sidecars": "sidecars",
    "write_report": "report",
    # configuration
    "CurateConfig": "config",
    "load_curate_config": "config",
    "StageThresholds": "config",
    "DecodeLimits": "config",
    # per-image work and the DAG in memory
    "DecodeError": "decode",
    "DecodedImage": "decode",
    "analyze_bytes": "image_analysis",
    "ImageAnalysis": "image_analysis",
    "curate_in_memory": "in_memory",
    "dedup_analyses": "in_memory",
    "Verdict": "in_memory",
    "DedupResult": "dedup",
    "OcrEngine": "ocr",
    "read_uri": "storage",
    "register_reader": "storage",
    # filters and hashes
    "CHEAP_FILTERS": "filters",
    "run_cheap_filters": "filters",
    "FilterResult": "filters",
    "image_hashes": "hashes",
    "md5": "hashes",
    "hamming": "hashes",
    "phash_bits": "hashes",
    "colorhash_bits": "hashes",
    "hue_histogram": "hashes",
    # embedding-level curation (image embedders in the ``embed`` submodule, `embed` extra)
    "hierarchical_kmeans": "kmeans",
    "balanced_sample": "kmeans",
    "sample_paths": "kmeans",
    "Hierarchy": "kmeans",
    "semantic_dedup": "semantic_dedup",
    "SemanticDedupResult": "semantic_dedup",
    "list_clusters": "review",
    "flag_cluster": "review",
    "decide_cluster": "review",
    "VlmClient": "vlm",
    "image_part": "vlm",
    "VlmUnavailable": "vlm",
    "LabelTask": "distill",
    "LinearHead": "distill",
    "pseudo_label": "distill",
    "train_head": "distill",
    "top_share": "pagerank",
    "name_clusters": "naming",
    "name_groups": "naming",
    "caption_batch": "captioning",
    "search_concepts": "coverage",
    "copy_score": "copy_verify",
    # evaluation against ground truth
    "precision_recall": "evaluate",
    "clean_kept": "evaluate",
    "pair_precision_recall": "evaluate",
    "DEFECT_REASONS": "evaluate",
}

__all__ = sorted([*_PUBLIC, "shapes", "embed"])

__getattr__, __dir__ = lazy_exports(__name__, {**_PUBLIC, "shapes": None, "embed": None})
