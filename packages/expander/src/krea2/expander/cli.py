"""``krea2 expander``: build SFT data, train the expander, serve it, expand a prompt."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

from krea2.infra.errors import UserError

app = typer.Typer(
    name="expander",
    help=(
        "The prompt expander: SFT data, SFT, serving, expansion.\n\n"
        'Example: krea2 expander expand "a red circle" --model runs/expander'
    ),
    no_args_is_help=True,
    add_completion=False,
)


def _load(model: Path):  # type: ignore[no-untyped-def]
    from krea2.expander.toy_model import load_model

    try:
        return load_model(model)
    except FileNotFoundError as e:
        raise UserError(str(e)) from None


@app.command("sft-data")
def sft_data(
    out: Annotated[Path, typer.Option(help="JSON-lines file of chats to write.")],
    shards: Annotated[
        list[Path] | None, typer.Option(help="ShapesWorld training shards (repeatable).")
    ] = None,
    scenes: Annotated[int, typer.Option(help="Without --shards: this many sampled scenes.")] = 0,
    seed: Annotated[int, typer.Option(help="Seed of the requests (and sampled scenes).")] = 0,
    rich: Annotated[int, typer.Option(help="Requests per visually rich scene.")] = 2,
) -> None:
    """Write SFT chats (short request -> thinking + long caption) for ShapesWorld scenes.

    Example: krea2 expander sft-data --scenes 200 --out chats.jsonl
    """
    import numpy as np

    from krea2.curate import shapes
    from krea2.expander.sft_data import Shaping, read_shard_scenes, shapes_sft_examples

    if shards:
        missing = [p for p in shards if not p.is_file()]
        if missing:
            raise UserError(f"--shards: no such file {missing[0]}")
        world = read_shard_scenes(shards)
    elif scenes > 0:
        rng = np.random.default_rng(seed)
        world = [shapes.sample_scene(rng, word_prob=0.3) for _ in range(scenes)]
    else:
        raise UserError("give --shards FILE... or --scenes N")
    examples = shapes_sft_examples(world, seed=seed, shaping=Shaping(rich=rich))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(e) + "\n" for e in examples))
    typer.echo(f"{len(examples)} chats from {len(world)} scenes -> {out}")


@app.command()
def sft(
    data: Annotated[Path, typer.Argument(help="JSON-lines chats from `sft-data`.")],
    out: Annotated[Path, typer.Option(help="Folder for the trained expander.")],
    base: Annotated[
        Path | None, typer.Option(help="Local Qwen3 folder; default: the toy model.")
    ] = None,
    steps: Annotated[int, typer.Option(help="Optimizer steps.")] = 600,
    batch_size: Annotated[int, typer.Option(help="Chats per step.")] = 16,
    lr: Annotated[float, typer.Option(help="Peak learning rate.")] = 3e-3,
) -> None:
    """Supervised fine-tuning with trl's SFTTrainer.

    Example: krea2 expander sft chats.jsonl --out runs/expander --steps 20
    """
    from krea2.expander.sft import SftConfig, run_sft

    if not data.is_file():
        raise UserError(f"{data}: no such file (write it with `krea2 expander sft-data`)")
    try:
        examples = [json.loads(line) for line in data.read_text().splitlines() if line.strip()]
    except json.JSONDecodeError as e:
        raise UserError(f"{data}: not JSON lines ({e})") from None
    cfg = SftConfig(
        base=str(base) if base else None, steps=steps, batch_size=batch_size, lr=lr,
        log_every=max(1, min(20, steps // 10)),
    )  # fmt: skip
    result = run_sft(examples, out, cfg)
    first, last = result["losses"][0][1], result["losses"][-1][1]
    typer.echo(f"loss {first:.3f} -> {last:.3f} over {steps} steps; expander in {out}")


@app.command()
def expand(
    prompt: Annotated[str, typer.Argument(help="The short request to expand.")],
    model: Annotated[Path, typer.Option(help="Folder of a trained expander.")],
    thinking: Annotated[bool, typer.Option(help="Also print the thinking trace.")] = False,
    temperature: Annotated[float, typer.Option(help="0: greedy.")] = 0.0,
) -> None:
    """Print the expansion of PROMPT (and optionally the thinking trace).

    Example: krea2 expander expand "a red circle" --model runs/expander --thinking
    """
    from krea2.expander.server import Expander

    if not prompt.strip():
        raise UserError("the prompt is empty: nothing to expand")
    [(trace, expansion)] = Expander(*_load(model)).expand([prompt], temperature=temperature)
    if thinking:
        typer.echo(f"thinking: {trace}", err=True)
    typer.echo(expansion)


@app.command()
def serve(
    model: Annotated[Path, typer.Argument(help="Folder of a trained expander (or Qwen3).")],
    host: Annotated[str, typer.Option(help="Bind address; loopback by default.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 7450,
    token: Annotated[
        str | None,
        typer.Option(
            envvar="KREA2_EXPANDER_TOKEN",
            help="Bearer token (API key) clients must send; needed off loopback.",
        ),
    ] = None,
    max_tokens: Annotated[
        int, typer.Option(help="Most tokens one request may ask to generate (400 beyond).")
    ] = 1024,
    max_message_chars: Annotated[
        int, typer.Option(help="Most characters in one message (400 beyond).")
    ] = 16_000,
    vllm: Annotated[
        bool,
        typer.Option(help="Serve with vLLM (install krea2-expander with its vllm extra)."),
    ] = False,
) -> None:
    """Serve the expander behind an OpenAI-compatible chat API (POST /v1/chat/completions).

    Loopback by default; a non-loopback --host needs --token (or KREA2_EXPANDER_TOKEN), which
    clients send as their API key. Bodies over 1 MiB get 413 before they are read.

    Example: krea2 expander serve runs/expander --port 7450
    """
    from krea2.expander.server import TOKEN_ENV
    from krea2.rl import check_bind

    check_bind(host, token, "the expander server", TOKEN_ENV)  # before the model loads
    if max_tokens < 1 or max_message_chars < 1:
        raise UserError("--max-tokens and --max-message-chars must be >= 1")
    if vllm:
        exe = shutil.which("vllm")
        if exe is None:
            raise UserError("--vllm: vLLM is not installed; pip install 'krea2-expander[vllm]'")
        cmd = [exe, "serve", str(model), "--host", host, "--port", str(port),
               "--reasoning-parser", "qwen3"]  # fmt: skip
        # vLLM reads its API key from the environment: a token in argv would show in `ps`
        env = {**os.environ, "VLLM_API_KEY": token} if token else None
        sys.exit(subprocess.call(cmd, env=env))
    import uvicorn

    from krea2.expander.server import ChatLimits, Expander, create_app

    expander = Expander(*_load(model))
    limits = ChatLimits(max_tokens=max_tokens, max_message_chars=max_message_chars)
    app_ = create_app(expander, model.name, token=token, limits=limits)
    typer.echo(f"serving {model} on http://{host}:{port}/v1/chat/completions", err=True)
    uvicorn.run(app_, host=host, port=port, log_level="warning")
