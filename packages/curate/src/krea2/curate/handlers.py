"""Batch handlers of the ``images`` table's jobs (``stages.STAGES``), run by krablet workers.

``analyze`` reads each file once (md5, size, format, the one decode, every cheap filter and
hash); ``ocr`` and ``tags`` decode again at their own size; ``captions`` reads the row's
metadata (and, for a captioner that looks at pixels, the image). Each handler class is
bound to a config (and a plugin name) with ``configured``, since krablet instantiates
handler classes without arguments.
"""

from __future__ import annotations

from typing import Any, ClassVar

from krea2.curate.config import CurateConfig
from krea2.curate.stages import ANALYZE_COLUMNS

ANALYZE_RESULTS = list(ANALYZE_COLUMNS)


# -- analyze ------------------------------------------------------------------------------------


def analyze_uri(args: tuple[str, CurateConfig]) -> dict[str, Any]:
    """Child-process work of the analyze job: read, decode once, filter, hash."""
    from krea2.curate.image_analysis import analyze_bytes
    from krea2.curate.storage import read_uri

    uri, cfg = args
    data = read_uri(uri)
    row = analyze_bytes(data, cfg).columns()
    row["bytes"] = len(data)
    return {k: row.get(k) for k in ANALYZE_RESULTS}


# decode_error of an image whose isolated child ran out of time or died, on both attempts
ISOLATION_ERRORS = {"IsolationTimeout": "timeout", "WorkerCrash": "crashed"}


class AnalyzeHandler:
    """Batch handler of ``images.analyze``. Decodes run in ``processes`` isolated children
    (``cfg.decode.max_seconds`` of CPU time per image, 3× that of wall time once a ready
    child has it, address space ``memory_mb``); an image whose child runs out of time or
    dies twice, in fresh children, gets ``decode_error`` 'timeout' or 'crashed' (reject
    ``broken``; ``retry_isolation_failures`` queues them again). Unreadable URIs fail the row
    (retried)."""

    cfg: ClassVar[CurateConfig] = CurateConfig()
    processes: ClassVar[int] = 1
    memory_mb: ClassVar[int] = 3072

    def setup(self) -> None:
        from krea2.curate.image_analysis import warm_up
        from krea2.curate.isolation import IsolatedPool
        from krea2.infra.metrics import counter

        # Compiled here first, so the children load the machine code instead of each
        # compiling it (their start-up is never counted against an image anyway).
        warm_up()
        timeout = self.cfg.decode.max_seconds
        self.pool = IsolatedPool(self.processes, timeout, self.memory_mb, warm_up=warm_up)
        self.verdicts = counter(
            "curate", "analyzed_total", "Images analyzed, by cheap verdict", ["reject"]
        )

    def __call__(self, rows: list[dict]) -> list[dict | Exception]:
        out: list[dict | Exception] = []
        results = self.pool.map(analyze_uri, [(r["uri"], self.cfg) for r in rows])
        for row, res in zip(rows, results, strict=True):
            if (error := ISOLATION_ERRORS.get(type(res).__name__)) is not None:
                res = {k: None for k in ANALYZE_RESULTS} | {
                    "md5": "",
                    "decode_error": error,
                    "reject": "broken",
                    "reason": str(res),
                }
                try:  # the file was readable: record its md5 and size anyway
                    from krea2.curate.hashes import md5
                    from krea2.curate.storage import read_uri

                    data = read_uri(row["uri"])
                    res["md5"], res["bytes"] = md5(data), len(data)
                except OSError:
                    pass
            if isinstance(res, dict):
                self.verdicts.labels(res.get("reject") or "kept").inc()
            out.append(res)
        return out


# -- ocr, tags and captions ----------------------------------------------------------------------


class OcrHandler:
    """Batch handler of ``images.ocr``: one rapidocr engine per slot."""

    cfg: ClassVar[CurateConfig] = CurateConfig()

    def setup(self) -> None:
        from krea2.curate.ocr import OcrEngine

        self.engine = OcrEngine(min_score=self.cfg.ocr.min_score)

    def __call__(self, rows: list[dict]) -> list[dict | Exception]:
        from krea2.curate.decode import DecodeError
        from krea2.curate.in_memory import ocr_image
        from krea2.curate.storage import read_uri

        out: list[dict | Exception] = []
        for row in rows:
            try:
                result, filters = ocr_image(read_uri(row["uri"]), self.cfg, self.engine)
            except (OSError, DecodeError) as exc:
                out.append(exc)
                continue
            failed = next((f.name for f in filters if not f.passed), "")
            out.append(
                {
                    "text_area": result.box_area_fraction,
                    "ocr_text": result.text,
                    "text_chars": result.char_count,
                    "text_lines": result.line_count,
                    "text_height": result.median_line_height,
                    "text_reject": failed,
                }
            )
        return out


class TagHandler:
    """Batch handler of ``images.tags``: the tagger registered as ``plugin``
    (``krea2.curate.plugins``) on each image's decode at ``decode.analysis_size``."""

    cfg: ClassVar[CurateConfig] = CurateConfig()
    plugin: ClassVar[str] = ""

    def setup(self) -> None:
        from krea2.curate.plugins import check_plugin, tagger

        self.tagger = tagger(check_plugin("tagger", self.plugin, "tags"))

    def __call__(self, rows: list[dict]) -> list[dict | Exception]:
        from krea2.curate.decode import DecodeError, decode
        from krea2.curate.image_analysis import decode_limits
        from krea2.curate.storage import read_uri

        out: list[dict | Exception] = []
        for row in rows:
            try:
                pixels = decode(read_uri(row["uri"]), decode_limits(self.cfg)).pixels
            except (OSError, DecodeError) as exc:
                out.append(exc)
                continue
            out.append({"tags": sorted(self.tagger(pixels))})
        return out


class CaptionHandler:
    """Batch handler of ``images.captions``: the captioner registered as ``plugin`` writes
    ``[{format, text}, ...]``. A row it has nothing for fails with ``NoCaption`` (skipped),
    never done with no caption: a done row is not claimed again, and its caption may only
    be missing for now (a sidecar not written yet)."""

    cfg: ClassVar[CurateConfig] = CurateConfig()
    plugin: ClassVar[str] = ""

    def setup(self) -> None:
        from krea2.curate.plugins import captioner, check_plugin

        self.captioner = captioner(check_plugin("captioner", self.plugin, "captions"))
        if self.plugin == "vlm":  # batched: a round of VLM requests, then one of rewrites
            from krea2.curate.captioning import clients

            self.clients = clients(self.cfg.captions)

    def __call__(self, rows: list[dict]) -> list[dict | Exception]:
        from krea2.curate.plugins import NoCaption, captions_from

        if self.plugin == "vlm":
            from krea2.curate.captioning import caption_batch

            return caption_batch(*self.clients, rows, self.cfg.captions)
        out: list[dict | Exception] = []
        for row in rows:
            try:
                given = self.captioner(row["uri"], row.get("meta"))
                where = f"captioner {self.plugin!r} on {row['uri']}"
                text = captions_from(given, where)  # a plain string is one caption
                if not text:
                    raise NoCaption(f"{where}: no caption for this image")
            except (OSError, ValueError) as exc:  # unreadable, or captions it cannot give
                out.append(exc)
                continue
            out.append({"captions": [{"format": f, "text": t} for f, t in text.items()]})
        return out


class EmbedHandler:
    """Batch handler of ``images.embed``: the embedder named by ``plugin`` (``KIND:PATH``,
    ``krea2.curate.embed.loaders``) on each image's decode at ``decode.analysis_size``; the
    claim's vectors go to the store as one float16 file (``embed.store``), the rows get
    references to them. A row that cannot be read or decoded fails alone (retried). Reads
    and decodes run in the embedder's prep thread, overlapped with the model."""

    cfg: ClassVar[CurateConfig] = CurateConfig()
    plugin: ClassVar[str] = ""

    def setup(self) -> None:
        from krea2.curate.embed.loaders import load_embedder

        e = self.cfg.embed
        self.embedder = load_embedder(self.plugin, e.device, e.dtype, e.batch_size)

    def __call__(self, rows: list[dict]) -> list[dict | Exception]:
        from pathlib import Path

        import numpy as np

        from krea2.curate.decode import DecodeError, decode
        from krea2.curate.embed.store import write_batch
        from krea2.curate.image_analysis import decode_limits
        from krea2.curate.storage import read_uri

        out: list[dict | Exception] = [{} for _ in rows]
        done: list[int] = []
        size = self.embedder.batch_size

        def batches():  # drawn by the embedder's prep thread: decodes overlap the model
            for start in range(0, len(rows), size):
                pixels = []
                for i in range(start, min(start + size, len(rows))):
                    try:
                        data = read_uri(rows[i]["uri"])
                        pixels.append(decode(data, decode_limits(self.cfg)).pixels)
                        done.append(i)
                    except (OSError, DecodeError) as exc:
                        out[i] = exc
                if pixels:
                    yield pixels

        parts = list(self.embedder.embed_batches(batches()))
        if parts:
            vectors = np.concatenate(parts)
            keys = [rows[i]["image_key"] for i in done]
            refs = write_batch(Path(self.cfg.embed.store), keys, vectors)
            for i, ref in zip(done, refs, strict=True):
                out[i] = {"embedding": ref, "embed_model": self.embedder.name}
        return out


class ClassifyHandler:
    """Batch handler of ``images.classify``: every head named in ``plugin`` (comma-separated
    head JSON files, ``krea2.curate.distill.LinearHead``) scores the row's stored vector."""

    cfg: ClassVar[CurateConfig] = CurateConfig()
    plugin: ClassVar[str] = ""

    def setup(self) -> None:
        from pathlib import Path

        from krea2.curate.distill import LinearHead

        self.heads = [LinearHead.load(Path(p)) for p in self.plugin.split(",") if p]

    def __call__(self, rows: list[dict]) -> list[dict | Exception]:
        from krea2.curate.embed.store import read_vectors

        x = read_vectors([r["embedding"] for r in rows], [r["image_key"] for r in rows])
        probs = {h.task: h.proba(x) for h in self.heads}
        return [
            {"class_scores": {t: float(p[i]) for t, p in probs.items()}} for i in range(len(rows))
        ]


def configured(handler: type, cfg: CurateConfig, **attrs: Any) -> type:
    """A subclass of ``handler`` bound to ``cfg`` and class attributes ``attrs`` (``plugin``,
    ``processes``)."""
    return type(handler.__name__, (handler,), {"cfg": cfg, **attrs})
