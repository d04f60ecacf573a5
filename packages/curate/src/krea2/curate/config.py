"""Typed curate configuration: decode limits, per-resolution-stage thresholds, dedup, OCR."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path


@dataclass(frozen=True)
class StageThresholds:
    """Cheap-filter and text thresholds for one resolution stage.

    Scores are computed on the analysis pixels (longest side ``DecodeLimits.analysis_size``),
    except sizes, which are of the original image.
    """

    min_side: int = 256  # px, shorter side of the original
    max_aspect: float = 3.0  # longer / shorter side (DataComp's basic filter uses 3)
    reject_animated: bool = True
    # The noise, Laplacian and complexity limits are calibrated on real photos
    # (benchmarks/curate_filters.py): noise images score <= 0.18, good photos >= 0.59 (grass);
    # the most detailed good photos reach a Laplacian of 5900 and an edge density of 0.35.
    min_neighbour_corr: float = 0.4  # grey's correlation with its right/lower neighbours
    max_laplacian_var: float = 12000.0  # grey levels², median tile variance of the Laplacian
    min_entropy: float = 0.05  # bits, mean of the three channel histograms
    max_white_ratio: float = 0.99  # share of pixels with every channel ≥ 250
    max_black_ratio: float = 0.99  # share of pixels with every channel ≤ 5
    max_flat_ratio: float = 0.995  # share of pixels within ±8 of the median colour
    max_border_fraction: float = 0.03  # widest uniform edge band / image side
    max_complexity: float = 0.45  # share of Canny edge pixels
    max_text_area: float = 0.15  # OCR box area / image area
    min_text_height: float = 6.0  # px: median text-line height after resizing to the stage


def _stages() -> dict[str, StageThresholds]:
    # Thresholds are re-tuned as resolution rises (report §2.3): bigger minimum sizes, and
    # text only needs to stay legible at the stage's own resolution.
    return {
        "256": StageThresholds(min_side=256, max_text_area=0.15, min_text_height=6.0),
        "512": StageThresholds(min_side=512, max_text_area=0.25, min_text_height=6.0),
        "1024": StageThresholds(min_side=1024, max_text_area=0.40, min_text_height=6.0),
    }


@dataclass(frozen=True)
class DecodeLimits:
    """Per-image decode bounds. Memory is bounded by ``max_pixels`` (declared in the header,
    checked before any pixel is decoded) times 4 bytes; time by ``max_seconds`` (main thread
    only); the analysis pixels have longest side ``analysis_size``."""

    max_bytes: int = 256 * 2**20
    max_pixels: int = 80_000_000
    max_seconds: float = 20.0
    analysis_size: int = 256


@dataclass(frozen=True)
class DedupConfig:
    """Near-duplicate thresholds: a pair is a duplicate when all three distances are within."""

    phash12_max_distance: int = 20  # of 144 bits
    colorhash_max_distance: int = 6  # of 42 bits
    phash8_max_distance: int = 10  # of 64 bits
    bands: int = 8  # multi-index hashing: the phash is cut into this many bands
    hue_max_distance: float = 0.3  # total variation of saturated-hue histograms, 0..1
    # Memory for the near-duplicate search: the in-memory FAISS index takes ~252 B per image;
    # past this budget the search runs over on-disk partitions (see dedup_partitioned).
    max_memory_mb: float = 2048.0
    spill_dir: str = ""  # partition files go here ("" = the system temp dir)
    # Crop ladders (krea2.curate.crop_ladder): crops keeping >= 85% of each side, overlays;
    # 20 is the distance measured on real photos (benchmarks/near_dups.py: precision and
    # recall 1.000 on every edit class, where phash alone finds 72% of crops and 39% of
    # corner watermarks). On by default, for photo collections; flat synthetic worlds may
    # want it off: on the demo's ShapesWorld pool it folds a large and a medium take of one
    # concept (the same corner in the centre window), so the demo's recipe sets 0.
    ladder_max_distance: int = 20  # of 144 bits, at 3 levels of one scale; 0: off
    # Ladder pairs are then verified on their pixels (copy_verify.LADDER_VIEW), since flat
    # synthetic scenes agree by layout alone (ShapesWorld: an orange circle and triangle in one
    # cell at distance 20). A pair is kept at copy_score >= this: real photos' crops and
    # overlays score >= 0.88, ShapesWorld's different shapes <= 0.81 (docs/curate.md); 0: off.
    ladder_verify: float = 0.85
    ladder_bands: int = 6  # exact-match band keys per level (24 bits each; 8: 18 bits)
    ladder_max_bucket: int = 10_000  # band keys shared by more images are skipped (0: none)


@dataclass(frozen=True)
class OcrConfig:
    """OCR job settings."""

    decode_size: int = 640  # px, longest side the OCR job decodes at
    min_score: float = 0.5  # rapidocr line confidence below which a line is ignored


@dataclass(frozen=True)
class ConceptConfig:
    """Over-represented concepts: a concept may tag at most ``max_share`` of the pool."""

    max_share: float = 0.15
    seed: int = 0


@dataclass(frozen=True)
class EmbedConfig:
    """The embed job: where vectors are stored and how the embedder runs."""

    store: str = "curate-embeddings"  # directory of the float16 batches (refs are absolute)
    device: str = "cpu"
    dtype: str = "float32"  # the model's compute dtype; stored vectors are float16
    batch_size: int = 64  # images per forward pass


@dataclass(frozen=True)
class SemanticConfig:
    """Semantic dedup within hierarchical k-means leaves (``krea2.curate.semantic_dedup``)."""

    threshold: float = 0.0  # cosine; 0 = the embedder's own (the toy encoder's calibrated one)
    leaf_size: int = 64  # mean leaf size: level 1 has ⌈n / leaf_size⌉ clusters
    levels: int = 2  # each level above has 8× fewer clusters
    max_leaf: int = 4096  # leaves above this are split again (bounds the per-leaf work)
    probe: int = 3  # leaves a row is compared in: its own and neighbours within ``margin``
    margin: float = 0.1
    seed: int = 0
    # Vectors above this many MiB are gathered into a memory-mapped file under spill_dir
    # (the system temp dir when ""): k-means samples them and dedup reads one leaf at a time.
    max_memory_mb: float = 1024.0
    spill_dir: str = ""
    # Pixel verification (``krea2.curate.copy_verify``): > 0 turns it on. Candidates are the
    # pairs within ``verify_slack`` below the threshold, at most ``candidates`` per row;
    # a candidate is a copy when the crop/tone-tolerant correlation reaches ``verify``.
    verify: float = 0.0
    verify_slack: float = 0.1
    candidates: int = 6
    verify_side: int = 96  # px, longer side of the compared thumbnails


@dataclass(frozen=True)
class SaeFilterConfig:
    """The SAE artifact filter (``krea2.curate.passes_embed.sae_pass``): a top-k SAE of
    ``features`` × ``k`` trained ``steps`` × ``batch`` rows; a feature is an artifact feature
    when the rows it dominates hold at least ``min_images`` rows with one of
    ``artifact_reasons`` (comma-separated reject reasons), at least ``min_share`` of them,
    and a binomial tail at the pool's base rate of at most ``max_p``. ``top_images``: the
    most activating images a VLM names a feature from."""

    features: int = 128
    k: int = 4
    steps: int = 400
    batch: int = 256
    top_images: int = 6
    min_images: int = 2
    min_share: float = 0.2
    max_p: float = 1e-3
    artifact_reasons: str = "text_density,text_legibility"
    seed: int = 0
    drop_features: str = ""  # filter by feature: rows dominated by these ids (a,b) are dropped
    label_url: str = ""  # a VLM server that names each feature from its top images; "" = none


@dataclass(frozen=True)
class VectorConfig:
    """pgvector copies of the embeddings (``krea2.curate.vectors``): the cosine index
    (``hnsw``, ``ivfflat`` or ``none`` for exact search), its build parameters, the search
    breadth of a query, and rows per write."""

    index: str = "hnsw"
    m: int = 16  # HNSW links per node
    ef_construction: int = 64
    lists: int = 0  # IVFFlat lists; 0 = rows / 1000 (at least 1)
    ef_search: int = 64  # HNSW candidates per query (at least k)
    probes: int = 4  # IVFFlat lists searched per query
    batch: int = 2000


@dataclass(frozen=True)
class BalanceConfig:
    """Balanced sampling over the k-means hierarchy: keep ``share`` of the kept rows."""

    share: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 < self.share <= 1.0:
            raise ValueError(f"balance.share must be in (0, 1], got {self.share}")


@dataclass(frozen=True)
class CaptionConfig:
    """The ``vlm`` captioner (``krea2.curate.captioning``): the OpenAI-compatible servers of
    the VLM and the rewriting LLM (``llm_url`` "" = the VLM's), the client's limits, the
    metadata keys shown to the VLM, and the caption check's thresholds."""

    vlm_url: str = "http://127.0.0.1:8000"
    vlm_model: str = "default"
    llm_url: str = ""
    llm_model: str = "default"
    timeout_s: float = 60.0
    retries: int = 3
    max_rps: float = 0.0  # requests per second per client; 0 = unlimited
    concurrency: int = 4
    max_tokens: int = 512
    garbage_retries: int = 2
    meta_keys: str = "source,alt,title"  # never the generator's scene: that is the answer
    min_omission_rate: float = 0.5
    min_rows: int = 3


@dataclass(frozen=True)
class CoverageConfig:
    """Concept coverage (``krea2.curate.coverage``): the concept file (one per line, or a
    danker rank file), how few kept rows make a concept rare, and the largest weight."""

    concepts: str = ""
    rare_rows: int = 5
    max_weight: float = 5.0


@dataclass(frozen=True)
class CurateConfig:
    """Everything ``krea2 curate`` reads; ``stage`` picks the thresholds in ``stages``."""

    stage: str = "256"
    stages: dict[str, StageThresholds] = field(default_factory=_stages)
    decode: DecodeLimits = field(default_factory=DecodeLimits)
    dedup: DedupConfig = field(default_factory=DedupConfig)
    ocr: OcrConfig = field(default_factory=OcrConfig)
    concepts: ConceptConfig = field(default_factory=ConceptConfig)
    embed: EmbedConfig = field(default_factory=EmbedConfig)
    semantic: SemanticConfig = field(default_factory=SemanticConfig)
    sae: SaeFilterConfig = field(default_factory=SaeFilterConfig)
    balance: BalanceConfig = field(default_factory=BalanceConfig)
    vectors: VectorConfig = field(default_factory=VectorConfig)
    captions: CaptionConfig = field(default_factory=CaptionConfig)
    coverage: CoverageConfig = field(default_factory=CoverageConfig)

    @property
    def stage_side(self) -> int:
        """The stage's resolution in px (stage names are their shorter side, e.g. "256")."""
        try:
            return int(self.stage)
        except ValueError:
            return self.thresholds().min_side

    def thresholds(self) -> StageThresholds:
        """The thresholds of the configured stage."""
        from krea2.infra.errors import UserError

        if self.stage not in self.stages:
            raise UserError(
                f"stage {self.stage!r} has no thresholds; configured stages are "
                f"{sorted(self.stages)} (set curate.stage or add [stages.{self.stage}])"
            )
        return self.stages[self.stage]


def load_curate_config(
    path: str | Path | None = None, overrides: Sequence[str] = (), stage: str | None = None
) -> CurateConfig:
    """A ``CurateConfig`` from a TOML file (optional) and ``key=value`` overrides.

    Stages merge (``krea2.infra.config``'s named sections): a file's ``[stages.256]`` table
    and an override ``stages.256.max_aspect=2.5`` change only the fields they name, on top
    of that stage's defaults (a new stage, e.g. ``[stages.2048]``, starts from
    ``StageThresholds()``); the other stages keep theirs. ``stage``: the resolution stage
    to use (overrides ``stage`` of the file).
    """
    from krea2.infra.config import load_config

    cfg = load_config(CurateConfig, path, overrides)
    if stage:
        cfg = replace(cfg, stage=stage)
    cfg.thresholds()  # fail now, with the fix, on a stage without thresholds
    return cfg
