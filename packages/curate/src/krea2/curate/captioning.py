"""Multi-stage captioning (report §2.4): OCR → VLM caption given the OCR text and metadata →
LLM rewrites into the shard contract's formats; and a check for captions that keep missing
an attribute.

Both models sit behind OpenAI-compatible servers (``krea2.curate.vlm.VlmClient``: retries
with backoff, a rate limit, ``concurrency`` requests in flight, answers that do not parse
asked again). The ``captions`` job runs this with ``--captioner vlm``: each claimed batch
is one round of VLM requests (image, the row's ``ocr_text`` from the OCR stage, the
metadata keys ``captions.meta_keys``), then one round of rewrites, and the row gets
``[{format, text}, ...]`` for every format of ``krea2.infra.CAPTION_FORMATS``. A row whose
requests failed after every retry fails alone (the job retries it later); the others land.

**Caption failures** (``krea2.curate.passes.caption_check_pass``): a VLM that consistently
omits a salient attribute (a colour it cannot name, the text in the image) writes captions
that teach the model to ignore it. Each tag word of a row (the ``tags`` stage: "red circle"
→ red, circle) and its OCR text are attributes its long caption should mention; an attribute
value left out of at least ``captions.min_omission_rate`` of the captions of the rows that
carry it (over at least ``captions.min_rows`` rows) is a consistent omission, and each row
whose caption omits one gets ``caption_reject = 'caption_omission'`` and ``caption_omits``
(what)."""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

import numpy as np

from krea2.curate.config import CaptionConfig
from krea2.curate.vlm import Messages, VlmClient, image_part

SYSTEM = "You write captions of images for training a text-to-image model."
VLM_PROMPT = (
    "Describe the image in detail: every object with its colour, shape and position, the "
    "background, and any text in it, exactly as written.\n"
    "Text found by OCR: {ocr}\nMetadata: {meta}"
)
REWRITE_PROMPT = (
    "Rewrite this image description as a JSON object with the keys long (the full "
    "description), medium (one sentence), short (a few words), tags (comma-separated "
    "tags) and json (an object with the image's objects and text). Answer with the JSON "
    "object only.\nDescription: {caption}"
)
OMISSION = "caption_omission"


def vlm_request(pixels: np.ndarray, ocr_text: str | None, meta: dict | None, keys: str) -> Messages:
    """The VLM request for one image: its pixels, OCR text and the ``keys`` of its meta."""
    wanted = [k.strip() for k in keys.split(",") if k.strip()]
    shown = {k: (meta or {})[k] for k in wanted if k in (meta or {})}
    text = VLM_PROMPT.format(ocr=json.dumps(ocr_text or ""), meta=json.dumps(shown))
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": [image_part(pixels), {"type": "text", "text": text}]},
    ]


def rewrite_request(caption: str) -> Messages:
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": REWRITE_PROMPT.format(caption=caption)},
    ]


def parse_caption(answer: str) -> str:
    """A VLM caption: non-empty text (a refusal-length answer is garbage)."""
    text = answer.strip()
    if len(text) < 8:
        raise ValueError(f"caption too short: {answer!r}")
    return text


def parse_formats(answer: str) -> dict[str, str]:
    """The rewrite's JSON → ``{format: text}`` for every caption format; anything else is a
    ``ValueError`` (asked again). ``json`` may be an object (stored as its JSON text)."""
    from krea2.infra import CAPTION_FORMATS

    match = re.search(r"\{.*\}", answer, re.S)
    try:
        data = json.loads(match.group(0) if match else answer)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {answer[:120]!r} ({exc})") from None
    if not isinstance(data, dict) or set(CAPTION_FORMATS) - set(data):
        raise ValueError(f"needs the keys {list(CAPTION_FORMATS)}: {answer[:120]!r}")
    out = {}
    for fmt in CAPTION_FORMATS:
        value = data[fmt]
        if fmt == "json" and isinstance(value, dict | list):
            value = json.dumps(value, sort_keys=True)
        if fmt == "tags" and isinstance(value, list):
            value = ", ".join(map(str, value))
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{fmt} must be non-empty text: {value!r}")
        out[fmt] = value.strip()
    return out


def clients(c: CaptionConfig) -> tuple[VlmClient, VlmClient]:
    """(the VLM's client, the rewriter's): one server may serve both."""
    kw: dict[str, Any] = {
        "timeout_s": c.timeout_s,
        "retries": c.retries,
        "max_rps": c.max_rps or None,
        "concurrency": c.concurrency,
        "max_tokens": c.max_tokens,
    }
    vlm = VlmClient(c.vlm_url, c.vlm_model, **kw)
    return vlm, VlmClient(c.llm_url or c.vlm_url, c.llm_model, **kw)


def caption_batch(
    vlm: VlmClient, llm: VlmClient, rows: list[dict], c: CaptionConfig
) -> list[dict | Exception]:
    """Caption ``rows`` (``uri``, ``meta``, ``ocr_text``): one round of VLM requests, one of
    rewrites. Per row ``{"captions": [{format, text}, ...]}`` or the exception that stopped
    it (unreadable image, server down after retries, garbage after re-asks)."""
    from krea2.curate.decode import DecodeError, decode
    from krea2.curate.storage import read_uri

    out: list[dict | Exception] = [{} for _ in rows]
    requests, index = [], []
    for i, row in enumerate(rows):
        try:
            pixels = decode(read_uri(row["uri"])).pixels
        except (OSError, DecodeError) as exc:
            out[i] = exc
            continue
        requests.append(vlm_request(pixels, row.get("ocr_text"), row.get("meta"), c.meta_keys))
        index.append(i)
    long = vlm.ask_many(requests, parse_caption, c.garbage_retries)
    todo = [(i, t) for i, t in zip(index, long, strict=True) if isinstance(t, str)]
    for i, t in zip(index, long, strict=True):
        if isinstance(t, Exception):
            out[i] = t
    rewrites = llm.ask_many([rewrite_request(t) for _, t in todo], parse_formats, c.garbage_retries)
    for (i, caption), formats in zip(todo, rewrites, strict=True):
        if isinstance(formats, Exception):
            out[i] = formats
            continue
        formats = {**formats, "long": caption}  # the VLM's own words stay the long caption
        out[i] = {"captions": [{"format": f, "text": t} for f, t in formats.items()]}
    return out


def _mentions(text: str, value: str) -> bool:
    return re.search(rf"\b{re.escape(value.lower())}\b", text.lower()) is not None


def omissions(rows: list[dict], min_rate: float, min_rows: int) -> tuple[dict[str, float], list]:
    """Consistent omissions over ``rows`` (``captions``, ``tags``, ``ocr_text``): (attribute
    value → the share of its rows' long captions that leave it out, for the values at or
    above ``min_rate`` over ≥ ``min_rows`` rows; per row, the sorted values it omits of
    those)."""
    carried: Counter[str] = Counter()
    missed: Counter[str] = Counter()
    per_row: list[set[str]] = []
    for r in rows:
        long = next((c["text"] for c in r["captions"] or [] if c["format"] == "long"), "")
        values = {w for tag in r.get("tags") or [] for w in tag.split()}
        left = {v for v in values if not _mentions(long, v)}
        ocr = (r.get("ocr_text") or "").strip()
        if ocr:
            values.add("<text>")
            if ocr.lower() not in long.lower():
                left.add("<text>")
        carried.update(values)
        missed.update(left)
        per_row.append(left)
    rates = {
        v: missed[v] / n for v, n in carried.items() if n >= min_rows and missed[v] / n >= min_rate
    }
    return rates, [sorted(left & set(rates)) for left in per_row]
