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

from typing import TYPE_CHECKING

from krea2.infra.lazy import lazy_exports

if TYPE_CHECKING:  # the real types for type checkers (``X as X``: re-exported)
    from krea2.curate import embed as embed
    from krea2.curate import shapes as shapes
    from krea2.curate.captioning import caption_batch as caption_batch
    from krea2.curate.config import CurateConfig as CurateConfig
    from krea2.curate.config import DecodeLimits as DecodeLimits
    from krea2.curate.config import StageThresholds as StageThresholds
    from krea2.curate.config import load_curate_config as load_curate_config
    from krea2.curate.copy_verify import copy_score as copy_score
    from krea2.curate.coverage import search_concepts as search_concepts
    from krea2.curate.decode import DecodedImage as DecodedImage
    from krea2.curate.decode import DecodeError as DecodeError
    from krea2.curate.dedup import DedupResult as DedupResult
    from krea2.curate.distill import LabelTask as LabelTask
    from krea2.curate.distill import LinearHead as LinearHead
    from krea2.curate.distill import pseudo_label as pseudo_label
    from krea2.curate.distill import train_head as train_head
    from krea2.curate.evaluate import DEFECT_REASONS as DEFECT_REASONS
    from krea2.curate.evaluate import clean_kept as clean_kept
    from krea2.curate.evaluate import pair_precision_recall as pair_precision_recall
    from krea2.curate.evaluate import precision_recall as precision_recall
    from krea2.curate.export import ExportStats as ExportStats
    from krea2.curate.export import Sample as Sample
    from krea2.curate.export import export_shards as export_shards
    from krea2.curate.export import export_warehouse as export_warehouse
    from krea2.curate.export import stage_buckets as stage_buckets
    from krea2.curate.filters import CHEAP_FILTERS as CHEAP_FILTERS
    from krea2.curate.filters import FilterResult as FilterResult
    from krea2.curate.filters import run_cheap_filters as run_cheap_filters
    from krea2.curate.hashes import colorhash_bits as colorhash_bits
    from krea2.curate.hashes import hamming as hamming
    from krea2.curate.hashes import hue_histogram as hue_histogram
    from krea2.curate.hashes import image_hashes as image_hashes
    from krea2.curate.hashes import md5 as md5
    from krea2.curate.hashes import phash_bits as phash_bits
    from krea2.curate.image_analysis import ImageAnalysis as ImageAnalysis
    from krea2.curate.image_analysis import analyze_bytes as analyze_bytes
    from krea2.curate.in_memory import Verdict as Verdict
    from krea2.curate.in_memory import curate_in_memory as curate_in_memory
    from krea2.curate.in_memory import dedup_analyses as dedup_analyses
    from krea2.curate.kmeans import Hierarchy as Hierarchy
    from krea2.curate.kmeans import balanced_sample as balanced_sample
    from krea2.curate.kmeans import hierarchical_kmeans as hierarchical_kmeans
    from krea2.curate.kmeans import sample_paths as sample_paths
    from krea2.curate.naming import name_clusters as name_clusters
    from krea2.curate.naming import name_groups as name_groups
    from krea2.curate.ocr import OcrEngine as OcrEngine
    from krea2.curate.pagerank import top_share as top_share
    from krea2.curate.pass_log import pass_results as pass_results
    from krea2.curate.pass_log import record_pass_result as record_pass_result
    from krea2.curate.plugins import Captioner as Captioner
    from krea2.curate.plugins import NoCaption as NoCaption
    from krea2.curate.plugins import Tagger as Tagger
    from krea2.curate.plugins import register_captioner as register_captioner
    from krea2.curate.plugins import register_tagger as register_tagger
    from krea2.curate.prepare import PrepareResult as PrepareResult
    from krea2.curate.prepare import prepare_folder as prepare_folder
    from krea2.curate.report import write_report as write_report
    from krea2.curate.review import decide_cluster as decide_cluster
    from krea2.curate.review import flag_cluster as flag_cluster
    from krea2.curate.review import list_clusters as list_clusters
    from krea2.curate.semantic_dedup import SemanticDedupResult as SemanticDedupResult
    from krea2.curate.semantic_dedup import semantic_dedup as semantic_dedup
    from krea2.curate.sidecars import read_sidecars as read_sidecars
    from krea2.curate.stages import STAGE_NAMES as STAGE_NAMES
    from krea2.curate.stages import STAGES as STAGES
    from krea2.curate.stages import TABLE as TABLE
    from krea2.curate.stages import Stage as Stage
    from krea2.curate.stages import StageKind as StageKind
    from krea2.curate.stages import final_reason as final_reason
    from krea2.curate.stages import images_table as images_table
    from krea2.curate.storage import read_uri as read_uri
    from krea2.curate.storage import register_reader as register_reader
    from krea2.curate.vlm import VlmClient as VlmClient
    from krea2.curate.vlm import VlmUnavailable as VlmUnavailable
    from krea2.curate.vlm import image_part as image_part
    from krea2.curate.warehouse import IngestResult as IngestResult
    from krea2.curate.warehouse import check_stages as check_stages
    from krea2.curate.warehouse import ingest as ingest
    from krea2.curate.warehouse import ingest_rows as ingest_rows
    from krea2.curate.warehouse import is_complete as is_complete
    from krea2.curate.warehouse import isolation_failures as isolation_failures
    from krea2.curate.warehouse import kept_rows as kept_rows
    from krea2.curate.warehouse import open_warehouse as open_warehouse
    from krea2.curate.warehouse import read_rows as read_rows
    from krea2.curate.warehouse import requeue as requeue
    from krea2.curate.warehouse import retry_isolation_failures as retry_isolation_failures
    from krea2.curate.warehouse import run_stages as run_stages
    from krea2.curate.warehouse import run_worker as run_worker
    from krea2.curate.warehouse import skipped_rows as skipped_rows
    from krea2.curate.warehouse import stage_progress as stage_progress

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
    "pass_results": "pass_log",
    "record_pass_result": "pass_log",
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
