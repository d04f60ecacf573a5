"""`krea2 dit`: sample and serve images, convert checkpoints, count FLOPs."""

from __future__ import annotations

import json
from pathlib import Path

import typer

app = typer.Typer(
    help="The Krea 2 DiT: sampling, serving, checkpoint conversion, FLOP counts.\n\n"
    "Example: krea2 dit flops --config krea2-12b --size 1024x1024",
    no_args_is_help=True,
)


# --quant of sample and serve: one option, one help text
QUANT_OPTION = typer.Option(
    "none",
    help="Block Linears' weights: none, int8 (CPU or GPU; ~1/4 of fp32's bytes) or float8 "
    "(CUDA 8.9+), torchao weight-only (the 'quant' extra).",
)


def _device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def _dtype(name: str, device: str):
    import torch

    from krea2.infra.errors import UserError

    table = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    if name == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    if name not in table:
        raise UserError(f"--dtype {name!r}: choose auto, fp32, bf16 or fp16")
    return table[name]


@app.command()
def sample(
    prompt: list[str] = typer.Option(..., help="Prompt; repeat for several images."),
    out: Path = typer.Option(..., help="Output folder for PNGs."),
    model: Path = typer.Option(
        None,
        help="A whole model folder: diffusers layout (transformer/, text_encoder/, tokenizer/, "
        "vae/, scheduler/) or the native release files (one DiT .safetensors, text_encoder/, "
        "vae/). Its scheduler's shift settings are used.",
    ),
    weights: Path = typer.Option(
        None, help="DiT checkpoint: .safetensors or diffusers folder (replaces --model's DiT)."
    ),
    size: str = typer.Option("1024x1024", help="WIDTHxHEIGHT in pixels."),
    steps: int = typer.Option(
        None, help="Euler steps (default: a distilled model's own, Turbo's 8, else 28)."
    ),
    cfg: float = typer.Option(
        None,
        help="Krea CFG w: v_c + w (v_c - v_u); 0 disables (default: 0 for a distilled "
        "model, else 4.5).",
    ),
    seed: int = typer.Option(0, help="Image i uses seed + i."),
    mu: float = typer.Option(
        None, help="Fixed time shift (default: recorded in the weights, else the scheduler's)."
    ),
    turbo: bool = typer.Option(
        False, help="Turbo settings: mu 1.15, 8 steps, no CFG (flags given still win)."
    ),
    negative: str = typer.Option("", help="Negative prompt (used when cfg != 0)."),
    text_encoder: str = typer.Option(
        None,
        help="'qwen3-vl:PATH' (local Qwen3-VL folder; its tokenizer beside it or in "
        "../tokenizer) or 'tiny[:SEED]'. Default: recorded in the weights, else --model's, "
        "else tiny.",
    ),
    text_tokens: int = typer.Option(
        None, help="Fixed text length T of the layout (default: recorded, else 512)."
    ),
    ae: str = typer.Option(
        None,
        help="'pixel[:F]', 'qwen-image:PATH' or 'flux2:PATH' (default: recorded, else "
        "--model's vae/, else pixel).",
    ),
    prediction: str = typer.Option(
        None, help="What the DiT outputs: velocity or x0 (default: recorded, else velocity)."
    ),
    batch_size: int = typer.Option(4, help="Prompts per forward pass."),
    device: str = typer.Option("auto", help="auto, cpu, cuda, cuda:1, ..."),
    dtype: str = typer.Option("auto", help="auto (bf16 on GPU, fp32 on CPU), fp32, bf16."),
    style_ref: list[str] = typer.Option(
        None,
        help="Style reference IMG[:STRENGTH] (strength >= 0, default 1; 0 = off); repeat for "
        "several (at most the module's slots). Needs a style module.",
    ),
    style_module: Path = typer.Option(
        None,
        help="Style-reference module (.safetensors) made for this DiT (default: --model's "
        "style.safetensors).",
    ),
    style_times: str = typer.Option(
        None,
        help="LO:HI: the style references act only while the flow time is in [LO, HI] "
        "(1 = noise, 0 = the image), IP-Adapter's start/end; 0:0.8 leaves the first steps, "
        "where objects are laid out, to the prompt. Default: every step.",
    ),
    lora: list[str] = typer.Option(
        None,
        help="LoRA adapter FILE[:SCALE] (default scale 1): a .safetensors from `krea2 train "
        "export` (diffusers, comfyui) or a diffusers LoRA folder; repeat to stack several.",
    ),
    quant: str = QUANT_OPTION,
) -> None:
    """Generate images from prompts and write PNGs.

    Weights written by `krea2 train pma/merge` record their text conditioning, prediction
    and shift (and a distilled student its steps, without CFG); those are used by default,
    and weights whose conditioning this command cannot rebuild are refused (sample them
    with `krea2 train sample`). A model folder marked distilled (Turbo) samples in 8 steps
    without CFG at mu 1.15 unless flags say otherwise.

    With --style-ref the images follow the references' style: each is resized to --size,
    encoded by the autoencoder and turned into a few tokens by the style module; under CFG
    both halves see them, so guidance amplifies the prompt, not the reference.

    Example: krea2 dit sample --weights toy.safetensors --prompt "a red circle" --size 32x32
    --steps 20 --cfg 2 --seed 0 --text-tokens 32 --out out/
    (add --style-ref ref.png:0.7 --style-module style.safetensors for a style reference,
    --style-times 0:0.8 to keep it out of the first steps, --lora maroon.safetensors:0.8 for
    an adapter)
    """
    from krea2.dit.components import load_autoencoder, load_text_encoder
    from krea2.dit.generation import generate, parse_size, save_pngs
    from krea2.dit.lora_files import applied, load_lora, parse_lora_spec
    from krea2.dit.sample_plan import plan_sample
    from krea2.dit.style_module import load_style_module
    from krea2.dit.style_refs import load_style_refs, parse_style_times, reference_tokens
    from krea2.dit.weight_quant import check_weight_quant, quantize_block_linears
    from krea2.dit.weights import from_pretrained
    from krea2.infra.errors import UserError

    w, h = parse_size(size)
    plan = plan_sample(
        model=model, weights=weights, text_encoder=text_encoder, autoencoder=ae,
        text_tokens=text_tokens, prediction=prediction, mu=mu, turbo=turbo, steps=steps,
        cfg=cfg, style_module=style_module,
    )  # fmt: skip
    refs, said = load_style_refs(style_ref or [], plan)  # before any weights load
    times = None if style_times is None else parse_style_times(style_times)
    if times is not None and not refs:
        raise UserError("--style-times needs a --style-ref to time")
    if said:
        typer.echo(said, err=True)
    adapters = []
    for spec in lora or []:
        _, path, scale = parse_lora_spec(spec)
        adapters.append((load_lora(path), scale))
    dev = _device(device)
    dt = _dtype(dtype, dev)
    check_weight_quant(quant, dev)
    typer.echo(f"sampling {len(prompt)} image(s) with {plan.describe()}", err=True)
    net = from_pretrained(plan.weights, dtype=dt, device=dev)
    quantize_block_linears(net, quant, dev)
    enc = load_text_encoder(plan.text_encoder, net.cfg, plan.text_tokens, dt, dev)
    autoenc = load_autoencoder(plan.autoencoder, dt, dev)
    style = None
    if refs and plan.style_module is not None:  # load_style_refs made sure there is one
        module = load_style_module(plan.style_module, net.cfg, device=dev, dtype=dt)
        style = reference_tokens(module, refs, autoenc, (w, h))
    for adapter, scale in adapters:
        typer.echo(f"LoRA {adapter.name} (rank {adapter.rank}) at scale {scale:g}", err=True)
    with applied(net, [(a.to(dev, dt), scale) for a, scale in adapters]):
        images = generate(
            net, enc, autoenc, prompt, w, h, steps=plan.steps, cfg=plan.cfg, seed=seed,
            mu=plan.time_shift, negative=negative, prediction=plan.prediction,
            x0_min_t=plan.x0_min_t, batch_size=batch_size, progress=True, style=style,
            style_times=times,
        )  # fmt: skip
    for p in save_pngs(images, out, [seed + i for i in range(len(prompt))]):
        typer.echo(str(p))


@app.command()
def serve(
    model: Path = typer.Option(
        ..., help="A whole model folder (diffusers or native release layout), as for sample."
    ),
    host: str = typer.Option("127.0.0.1", help="Bind address; loopback by default."),
    port: int = typer.Option(7460, help="TCP port."),
    token: str = typer.Option(
        None,
        envvar="KREA2_DIT_TOKEN",
        help="Bearer token (API key) clients must send; needed off loopback.",
    ),
    expander: str = typer.Option(
        None,
        help="OpenAI-compatible chat base URL (e.g. http://127.0.0.1:7450/v1 from "
        "`krea2 expander serve`): each prompt is expanded first, returned as revised_prompt.",
    ),
    expander_model: str = typer.Option(None, help="Model name to ask the expander for."),
    expander_timeout_s: float = typer.Option(30.0, help="Expander timeout; 502 beyond."),
    max_batch: int = typer.Option(8, help="Most images per sampling call (1: no batching)."),
    batch_wait_ms: float = typer.Option(
        10.0, help="Longest a request waits for others of its shape to join its batch."
    ),
    size: str = typer.Option("1024x1024", help="Size of requests that give none."),
    max_n: int = typer.Option(8, help="Most images per request."),
    max_steps: int = typer.Option(100, help="Most Euler steps a request may ask for."),
    max_side: int = typer.Option(2048, help="Largest width or height in pixels."),
    max_body_bytes: int = typer.Option(16 * 2**20, help="Largest request body (413 beyond)."),
    keep_images: int = typer.Option(256, help="PNGs kept for response_format=url."),
    text_tokens: int = typer.Option(
        None, help="Fixed text length T (default: recorded in the weights, else 512)."
    ),
    device: str = typer.Option("auto", help="auto, cpu, cuda, cuda:1, ..."),
    dtype: str = typer.Option("auto", help="auto (bf16 on GPU, fp32 on CPU), fp32, bf16."),
    lora: list[str] = typer.Option(
        None,
        help="LoRA adapter NAME=PATH that requests apply by name (loras: [{name, scale}]); "
        "repeat for several. Loaded once; the base weights are never changed.",
    ),
    quant: str = QUANT_OPTION,
) -> None:
    """Serve a model folder behind an OpenAI Images-compatible API.

    POST /v1/images/generations takes prompt, n, size (WxH), response_format (b64_json or
    url, then GET /v1/images/ID.png), seed, and steps, cfg, negative_prompt, turbo,
    style_references ([{image: base64 PNG/JPEG, strength}], with a style.safetensors in the
    folder), loras ([{name, scale}] of the --lora adapters). Concurrent requests of one
    shape are sampled together. GET /health, /metrics (Prometheus). Loopback by default; a
    non-loopback --host needs --token (or KREA2_DIT_TOKEN). SIGTERM finishes the accepted
    requests, then exits.

    Example: krea2 dit serve --model tiny-model --size 32x32 --text-tokens 16 --port 7460

    Then: curl -s localhost:7460/v1/images/generations -d '{"prompt": "a red circle"}'
    """
    from krea2.infra.errors import UserError
    from krea2.infra.extras import import_extra

    for module in ("fastapi", "uvicorn"):
        import_extra(module, "serve", "krea2-dit")
    from krea2.dit.image_requests import RequestLimits
    from krea2.dit.image_server import TOKEN_ENV, ImageServerConfig
    from krea2.dit.image_server import serve as run
    from krea2.dit.lora_files import named_lora_files
    from krea2.dit.served_model import ServedModel
    from krea2.dit.weight_quant import check_weight_quant
    from krea2.infra.serving import check_bind

    check_bind(host, token, "the image server", TOKEN_ENV)  # before the model loads
    for name, value in (
        ("--max-batch", max_batch),
        ("--max-n", max_n),
        ("--max-steps", max_steps),
        ("--max-side", max_side),
        ("--max-body-bytes", max_body_bytes),
        ("--keep-images", keep_images),
    ):
        if value < 1:
            raise UserError(f"{name} {value} must be >= 1")
    if batch_wait_ms < 0 or expander_timeout_s <= 0:
        raise UserError("--batch-wait-ms must be >= 0 and --expander-timeout-s > 0")
    limits = RequestLimits(
        max_n=max_n, max_steps=max_steps, max_side=max_side, max_body_bytes=max_body_bytes
    )
    config = ImageServerConfig(
        max_batch=max_batch,
        batch_wait_ms=batch_wait_ms,
        default_size=size,
        token=token,
        limits=limits,
        keep_images=keep_images,
        expander=expander,
        expander_model=expander_model,
        expander_timeout_s=expander_timeout_s,
    )
    _check_default_size(size, model, max_side)  # before the weights load
    loras = named_lora_files(lora or [])
    dev = _device(device)
    check_weight_quant(quant, dev)
    served = ServedModel.load(
        model, text_tokens=text_tokens, device=dev, dtype=_dtype(dtype, dev), loras=loras,
        quant=quant,
    )  # fmt: skip
    typer.echo(
        f"serving {model} ({served.plan.describe()}) on http://{host}:{port}/v1/images/generations",
        err=True,
    )
    run(served, host, port, config)


def _check_default_size(size: str, model: Path, max_side: int) -> None:
    """UserError unless --size is a size a request to `model` could ask for."""
    from krea2.dit.components import latent_space
    from krea2.dit.generation import parse_size
    from krea2.dit.release import read_dit_config
    from krea2.dit.sample_plan import plan_sample
    from krea2.infra.errors import UserError

    w, h = parse_size(size)
    plan = plan_sample(model=model)
    multiple = latent_space(plan.autoencoder).factor * read_dit_config(plan.weights).patch
    if w % multiple or h % multiple or max(w, h) > max_side:
        raise UserError(
            f"--size {size}: width and height must be multiples of {multiple} "
            f"and at most --max-side {max_side}"
        )


@app.command()
def convert(
    src: Path = typer.Argument(..., help="Checkpoint file or diffusers folder."),
    dst: Path = typer.Argument(..., help="Output file (krea, gguf) or folder (diffusers)."),
    to: str = typer.Option(..., "--to", help="diffusers, krea or gguf."),
    qtype: str = typer.Option(
        "Q8_0", help="GGUF type of the big weights: Q8_0, Q5_1, Q5_0, Q4_1, Q4_0, F16, BF16."
    ),
) -> None:
    """Convert a DiT checkpoint between the released (krea), diffusers and GGUF formats
    (GGUF in ComfyUI-GGUF's krea2 layout; any of them samples with --weights).

    Example: krea2 dit convert --to diffusers krea2-raw.safetensors krea2-raw-diffusers/
    (or --to gguf --qtype Q4_1 krea2-raw.safetensors krea2-raw-Q4_1.gguf)
    """
    from krea2.dit.weights import convert as run
    from krea2.infra.errors import UserError

    if to not in ("diffusers", "krea", "gguf"):
        raise UserError(f"--to {to!r}: choose diffusers, krea or gguf")
    typer.echo(f"wrote {run(src, dst, to=to, qtype=qtype)}")


@app.command()
def flops(
    config: str = typer.Option("krea2-12b", help="Named config (krea2-12b, toy, tiny, ...)."),
    size: str = typer.Option("1024x1024", help="WIDTHxHEIGHT in pixels."),
    batch: int = typer.Option(1, help="Batch size."),
    text_tokens: int = typer.Option(512, help="Text tokens T."),
    ae_factor: int = typer.Option(8, help="Autoencoder spatial factor (1 for PixelAE)."),
    checkpointing: str = typer.Option("none", help="none, full or selective."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Print parameters, FLOPs per forward and per training step.

    Example: krea2 dit flops --config krea2-12b --size 1024x1024
    """
    from krea2.dit.config import get_config
    from krea2.dit.flops import cost, format_flops
    from krea2.dit.flow import image_tokens
    from krea2.dit.generation import parse_size

    cfg = get_config(config)
    w, h = parse_size(size)
    n = image_tokens(h, w, ae_factor * cfg.patch)
    ac = None if checkpointing == "none" else checkpointing
    c = cost(cfg, batch, n, text_tokens, checkpointing=ac)
    d = {"config": config, "size": size, "batch": batch, "image_tokens": n,
         "text_tokens": text_tokens, **c.as_dict()}  # fmt: skip
    if as_json:
        typer.echo(json.dumps(d))
        return
    typer.echo(f"config {config}: {c.params:,} parameters")
    typer.echo(f"{size} x batch {batch}: {n} image + {text_tokens} text tokens")
    typer.echo(f"forward:       {format_flops(c.forward_flops)}")
    typer.echo(f"training step: {format_flops(c.train_flops)} (forward + backward)")
