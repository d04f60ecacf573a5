"""The curation DAG run in one process: cheap stage → dedup → OCR → concept cap.

The warehouse stages (``krea2.curate.stages``) run the same functions over krablet; this
in-memory form serves tests, benchmarks and small pools. A verdict's reason is read from
the same reject columns as a warehouse row's (``stages.final_reason``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from krea2.curate.concepts import ConceptVerdict, rebalance
from krea2.curate.config import CurateConfig
from krea2.curate.copy_verify import decoding_reader
from krea2.curate.decode import decode
from krea2.curate.dedup import DedupResult, dedup_configured
from krea2.curate.filters.base import FilterResult
from krea2.curate.image_analysis import ImageAnalysis, analyze_bytes, decode_limits
from krea2.curate.ocr import OcrEngine, OcrResult, text_filters
from krea2.curate.plugins import Tagger
from krea2.curate.stages import final_reason


@dataclass
class Verdict:
    """Everything the DAG decided about one image; ``reason`` is the final reject reason
    (None = kept), in stage order."""

    key: str
    analysis: ImageAnalysis
    duplicate: str = ""  # "", "exact_duplicate" or "near_duplicate"
    dup_of: str = ""  # the key of the image a duplicate's group keeps
    ocr: OcrResult | None = None
    text: list[FilterResult] | None = None
    concept: ConceptVerdict | None = None

    def reject_columns(self) -> dict:
        """The verdict as the warehouse's reject columns (``stages.reject_columns``)."""
        return {
            "reject": self.analysis.reject,
            "dup_kind": self.duplicate,
            "text_reject": next((f.name for f in self.text or () if not f.passed), ""),
            "concept_keep": self.concept.keep if self.concept is not None else None,
        }

    @property
    def reason(self) -> str | None:
        return final_reason(self.reject_columns())


def dedup_analyses(
    analyses: Sequence[ImageAnalysis], cfg: CurateConfig, datas: Sequence[bytes] | None = None
) -> DedupResult:
    """Dedup decoded images (in ingest order) by md5, phash12, phash8, colorhash, hue and
    crop ladder. ``datas``: the images' bytes, decoded again to verify crop-ladder pairs on
    their pixels (needed with the ladder on and ``dedup.ladder_verify`` > 0)."""
    md5s = [a.md5 for a in analyses]
    phash = np.stack([np.frombuffer(a.hashes["phash12"], np.uint8) for a in analyses])
    color = np.stack([np.frombuffer(a.hashes["colorhash"], np.uint8) for a in analyses])
    phash8 = np.stack([np.frombuffer(a.hashes["phash8"], np.uint8) for a in analyses])
    hue = np.stack([np.frombuffer(a.hashes["huehist"], np.uint8) for a in analyses])
    ladder = np.stack([np.frombuffer(a.hashes["ladder"], np.uint8) for a in analyses])
    areas = np.asarray([(a.width or 0) * (a.height or 0) for a in analyses], np.int64)
    read = None
    if datas is not None:
        sizes = [(a.width, a.height) if a.width and a.height else None for a in analyses]
        read = decoding_reader(datas.__getitem__, sizes)
    return dedup_configured(md5s, phash, color, phash8, areas, hue, cfg.dedup, ladder, read)


def ocr_image(data: bytes, cfg: CurateConfig, engine: OcrEngine) -> tuple[OcrResult, list]:
    """The OCR job's work on one image: its own decode at ``ocr.decode_size``, then text
    filters at the stage's resolution."""
    pixels = decode(data, decode_limits(cfg, cfg.ocr.decode_size)).pixels
    result = engine.read(pixels)
    return result, text_filters(result, cfg.thresholds(), cfg.stage_side)


def curate_in_memory(
    keys: Sequence[str],
    datas: Sequence[bytes],
    cfg: CurateConfig | None = None,
    ocr: OcrEngine | None = None,
    tagger: Tagger | None = None,
) -> list[Verdict]:
    """Run the DAG over images given in ingest order. OCR runs only on dedup keepers that
    passed the cheap filters, tagging only on images that also passed OCR; either stage is
    skipped when its engine is None."""
    cfg = cfg or CurateConfig()
    verdicts = [Verdict(k, analyze_bytes(d, cfg)) for k, d in zip(keys, datas, strict=True)]
    alive = [i for i, v in enumerate(verdicts) if v.reason is None]
    if alive:
        result = dedup_analyses(
            [verdicts[i].analysis for i in alive], cfg, [datas[i] for i in alive]
        )
        for j, i in enumerate(alive):
            verdicts[i].duplicate = str(result.kind[j])
        for keeper, *copies in result.groups():
            for j in copies:
                verdicts[alive[j]].dup_of = keys[alive[keeper]]
    if ocr is not None:
        for i, v in enumerate(verdicts):
            if v.reason is None:
                v.ocr, v.text = ocr_image(datas[i], cfg, ocr)
    if tagger is not None:
        alive = [i for i, v in enumerate(verdicts) if v.reason is None]
        tags = [tagger(decode(datas[i], decode_limits(cfg)).pixels) for i in alive]
        c = cfg.concepts
        for i, cv in zip(
            alive, rebalance([keys[i] for i in alive], tags, c.max_share, c.seed), strict=True
        ):
            verdicts[i].concept = cv
    return verdicts
