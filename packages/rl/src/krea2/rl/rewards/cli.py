"""``krea2 rl serve-reward`` and ``krea2 rl score``: rewards from the command line."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from krea2.infra.errors import UserError
from krea2.infra.progress import progress

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")


def _reward(kind: str):  # type: ignore[no-untyped-def]
    from krea2.rl.rewards.registry import load_reward

    try:
        return load_reward(kind)
    except ValueError as e:
        raise UserError(f"--kind: {e}") from None


def serve_reward(
    kind: Annotated[str, typer.Option(help="Reward spec: rubric, text, artifact:PATH, …")],
    host: Annotated[str, typer.Option(help="Bind address; loopback by default.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 7440,
    token: Annotated[
        str | None,
        typer.Option(envvar="KREA2_REWARD_TOKEN", help="Bearer token clients must send."),
    ] = None,
    max_batch: Annotated[int, typer.Option(help="Images per reward call at most.")] = 32,
    max_wait_ms: Annotated[float, typer.Option(help="Longest wait to fill a batch.")] = 5.0,
    request_timeout_s: Annotated[float, typer.Option(help="504 after this long.")] = 60.0,
    max_body_mb: Annotated[float, typer.Option(help="413 for a larger body, unread.")] = 64.0,
    max_images: Annotated[int, typer.Option(help="Most images in one request.")] = 256,
    max_image_pixels: Annotated[
        int, typer.Option(help="Most pixels in one image (413 from its header).")
    ] = 4096 * 4096,
    max_request_pixels: Annotated[
        int, typer.Option(help="Most pixels in one request, all images together.")
    ] = 32 * 2**20,
) -> None:
    """Serve a reward over HTTP with dynamic batching (POST /score, /health, /metrics).

    Loopback by default; a non-loopback --host needs --token. Wire format: krea2.rl.rewards.wire.
    Requests over a --max-* limit get 413, checked before the bytes are read or decoded.

    Example: krea2 rl serve-reward --kind rubric --port 7440 --max-batch 32
    """
    from krea2.rl.rewards.server import TOKEN_ENV, ServerConfig, serve
    from krea2.rl.rewards.wire import RequestLimits
    from krea2.rl.serving import check_bind

    check_bind(host, token, "the reward server", TOKEN_ENV)  # before the reward loads

    if max_batch < 1 or max_wait_ms < 0 or request_timeout_s <= 0:
        raise UserError("--max-batch must be ≥ 1, --max-wait-ms ≥ 0, --request-timeout-s > 0")
    if min(max_body_mb, max_images, max_image_pixels, max_request_pixels) <= 0:
        raise UserError("--max-body-mb, --max-images and --max-*-pixels must be > 0")
    reward = _reward(kind)
    limits = RequestLimits(
        int(max_body_mb * 2**20), max_images, max_image_pixels, max_request_pixels
    )
    config = ServerConfig(max_batch, max_wait_ms, request_timeout_s, token, limits=limits)
    typer.echo(f"serving reward {reward.name} on http://{host}:{port} (POST /score)", err=True)
    try:
        serve(reward, host, port, config)
    except ValueError as e:
        raise UserError(str(e)) from None


def _prompt_of(image: Path) -> str | None:
    text = image.with_suffix(".txt")
    if text.is_file():
        return text.read_text().strip()
    sidecar = image.with_suffix(".json")
    if sidecar.is_file():
        try:
            meta = json.loads(sidecar.read_text())
        except json.JSONDecodeError as e:
            raise UserError(f"{sidecar} is not JSON: {e}") from None
        for key in ("prompt", "caption"):
            if isinstance(meta.get(key), str):
                return meta[key]
        captions = meta.get("captions")
        if isinstance(captions, list) and captions and isinstance(captions[0], dict):
            return str(captions[0].get("text", "")) or None
    return None


def _prompts(folder: Path, prompts_jsonl: Path | None) -> list[tuple[Path, str]]:
    if prompts_jsonl is not None:
        pairs = []
        for n, line in enumerate(prompts_jsonl.read_text().splitlines(), 1):
            if line.strip():
                row = json.loads(line)
                if "image" not in row or "prompt" not in row:
                    raise UserError(f'{prompts_jsonl}:{n}: each line needs "image" and "prompt"')
                pairs.append((folder / row["image"], str(row["prompt"])))
        return pairs
    images = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    pairs = [(p, _prompt_of(p)) for p in images]
    missing = [p.name for p, prompt in pairs if not prompt]
    if missing:
        raise UserError(
            f"no prompt for {len(missing)} images (e.g. {missing[0]}): give each a <stem>.txt "
            'or a <stem>.json with "prompt", or pass --prompts FILE.jsonl'
        )
    return pairs  # type: ignore[return-value]


def score(
    folder: Annotated[Path, typer.Argument(help="Folder of images (png, jpg, webp).")],
    kind: Annotated[str | None, typer.Option(help="Reward spec, scored in-process.")] = None,
    url: Annotated[str | None, typer.Option(help="Reward server URL instead of --kind.")] = None,
    token: Annotated[str | None, typer.Option(envvar="KREA2_REWARD_TOKEN")] = None,
    prompts: Annotated[
        Path | None, typer.Option(help='JSONL of {"image": NAME, "prompt": TEXT}.')
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Write JSONL here (default stdout).")] = None,
    batch_size: Annotated[int, typer.Option(help="Images per reward call.")] = 16,
) -> None:
    """Score a folder of images with their prompts; one JSON line per image.

    Prompts come from a sidecar <stem>.txt or <stem>.json ("prompt"), or --prompts FILE.jsonl.
    Scores in-process (--kind) or on a reward server (--url).

    Example: krea2 rl score renders/ --kind rubric --out scores.jsonl
    """
    from PIL import Image

    from krea2.rl.rewards.client import RewardClient

    if (kind is None) == (url is None):
        raise UserError("give exactly one of --kind (in-process) or --url (a reward server)")
    if not folder.is_dir():
        raise UserError(f"{folder} is not a folder of images")
    reward = _reward(kind) if kind else RewardClient(url or "", token)
    pairs = _prompts(folder, prompts)
    by_size: dict[tuple[int, int], list[tuple[Path, str, np.ndarray]]] = {}
    for path, prompt in pairs:
        try:
            with Image.open(path) as img:
                pixels = np.asarray(img.convert("RGB"))
        except OSError as e:
            raise UserError(f"cannot read image {path}: {e}") from None
        by_size.setdefault(pixels.shape[:2], []).append((path, prompt, pixels))
    sink = out.open("w") if out else sys.stdout
    try:
        with progress("score", total=len(pairs), unit="image") as bar:
            for items in by_size.values():
                for i in range(0, len(items), batch_size):
                    chunk = items[i : i + batch_size]
                    result = reward(np.stack([c[2] for c in chunk]), [c[1] for c in chunk])
                    for j, (path, prompt, _) in enumerate(chunk):
                        subs = {k: float(v[j]) for k, v in result.sub_scores.items()}
                        row = {
                            "image": path.name,
                            "prompt": prompt,
                            "score": float(result.scores[j]),
                        }
                        sink.write(json.dumps({**row, "sub_scores": subs}) + "\n")
                    bar.advance(len(chunk))
    except (ValueError, ConnectionError) as e:
        raise UserError(str(e)) from None
    finally:
        if out:
            sink.close()


def register(app: typer.Typer) -> None:
    """Add the reward commands to ``krea2 rl``."""
    app.command("serve-reward")(serve_reward)
    app.command("score")(score)


def _standalone() -> typer.Typer:
    app = typer.Typer(name="rl-rewards", no_args_is_help=True, add_completion=False)
    register(app)
    return app


if __name__ == "__main__":  # python -m krea2.rl.rewards.cli serve-reward … (tests, no install)
    from krea2.infra.host import run_cli

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    raise SystemExit(run_cli(_standalone(), sys.argv[1:]))
