"""OCR text density with rapidocr (ONNX models ship in the wheel): text, box area, lines, chars."""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from krea2.curate.config import StageThresholds
from krea2.curate.filters.base import FilterResult, at_least, at_most


@dataclass(frozen=True)
class TextLine:
    """One recognised line: ``box`` (4, 2) float32 corner points in pixels of the OCR'd image."""

    text: str
    score: float
    box: np.ndarray

    @property
    def height(self) -> float:
        """Line height in px: the mean length of the box's two short sides."""
        b = self.box
        sides = [np.linalg.norm(b[i] - b[(i + 1) % 4]) for i in range(4)]
        return float(np.mean(sorted(sides)[:2]))


@dataclass(frozen=True)
class OcrResult:
    """OCR of one image of ``width``×``height`` px."""

    lines: tuple[TextLine, ...]
    width: int
    height: int

    @property
    def text(self) -> str:
        return "\n".join(line.text for line in self.lines)

    @property
    def char_count(self) -> int:
        return sum(len(line.text.replace(" ", "")) for line in self.lines)

    @property
    def line_count(self) -> int:
        return len(self.lines)

    @property
    def box_area_fraction(self) -> float:
        """Share of the image covered by text boxes (overlaps counted once)."""
        if not self.lines:
            return 0.0
        mask = np.zeros((self.height, self.width), np.uint8)
        for line in self.lines:
            # One polygon per call: fillPoly with several polygons fills their overlaps
            # by the even-odd rule, i.e. not at all.
            cv2.fillPoly(mask, [np.rint(line.box).astype(np.int32)], 1)
        return cv2.countNonZero(mask) / mask.size

    @property
    def median_line_height(self) -> float:
        """Median line height in px of the OCR'd image; 0.0 without text."""
        return float(np.median([line.height for line in self.lines])) if self.lines else 0.0


class OcrEngine:
    """A rapidocr engine (text detection limited to ``det_side`` px, no angle classifier).

    Creating one costs about 1–2 s; share one per process. One inference thread by default:
    workers scale by processes, and on a busy host extra threads only contend (measured
    0.09 s/image with 1 thread vs 0.21 s with 2 on a loaded 2-core machine). Needs the
    ``ocr`` extra.
    """

    def __init__(self, det_side: int = 320, min_score: float = 0.5, threads: int = 1) -> None:
        try:
            from rapidocr import RapidOCR
        except ImportError:
            from krea2.infra.errors import UserError

            raise UserError(
                "OCR needs rapidocr; install it with: pip install 'krea2-curate[ocr]'"
            ) from None
        self.min_score = min_score
        self._engine = RapidOCR(
            params={
                "Global.log_level": "error",
                "Global.use_cls": False,
                "Det.limit_type": "max",
                "Det.limit_side_len": det_side,
                "EngineConfig.onnxruntime.intra_op_num_threads": threads,
                "EngineConfig.onnxruntime.inter_op_num_threads": threads,
            }
        )

    def read(self, pixels: np.ndarray) -> OcrResult:
        """OCR (h, w, 3) uint8 RGB.

        Dropped: lines under ``min_score``; lines with fewer than 2 letters or digits (the
        detector reads a circle as "O", a square as "■", and sometimes a whole flat frame as
        one letter); lines taller than a third of the image (the same whole-frame misreads).
        """
        out = self._engine(np.ascontiguousarray(pixels[:, :, ::-1]))  # rapidocr expects BGR
        lines: list[TextLine] = []
        tallest = min(pixels.shape[:2]) / 3
        if out.boxes is not None and out.txts:
            for box, text, score in zip(out.boxes, out.txts, out.scores, strict=True):
                line = TextLine(text, float(score), np.asarray(box, np.float32))
                alnum = sum(ch.isalnum() for ch in text)
                if score >= self.min_score and alnum >= 2 and line.height <= tallest:
                    lines.append(line)
        return OcrResult(tuple(lines), pixels.shape[1], pixels.shape[0])


def text_filters(result: OcrResult, t: StageThresholds, stage_side: int) -> list[FilterResult]:
    """The two text filters of a stage whose images have shorter side ``stage_side`` px.

    ``text_density``: box-area share at most ``max_text_area``. ``text_legibility``: the
    median line height, rescaled to the stage's resolution, at least ``min_text_height`` px
    (text that small cannot be rendered, so the caption would describe what the model
    cannot draw). Images without text pass both.
    """
    density = at_most("text_density", result.box_area_fraction, t.max_text_area, "text area share")
    if not result.lines:
        return [density, FilterResult("text_legibility", 0.0, True)]
    scale = stage_side / min(result.width, result.height)
    height = result.median_line_height * scale
    legible = at_least("text_legibility", height, t.min_text_height, "text height at stage px")
    return [density, legible]
