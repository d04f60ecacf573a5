"""Demo stage ``sft-merge`` (report §4.3): domain SFT from one base and merging into a
generalist, on ShapesWorld.

Each domain owns its own content and gives it a house style the base has never drawn:
domain A owns the circles and renders them on maroon, domain B the squares on teal
(background colours the world's scenes never use; triangles and diamonds belong to
neither). A domain's LoRA SFT set is its own scenes, three times as many per concept, plus
the base's black / dark gray scenes of every concept it does not own (prior preservation).
Captions are the exporter's, with ``short`` replaced by the content prompt
(:func:`content_prompt`, no background clause) and weighted up (:data:`CAPTION_WEIGHTS`),
so an SFT learns what a prompt that names no background gets: its style for its own
content, the base's background for everything else. The style of a model is measured on
content prompts of each domain's concepts; a generalist merge keeps both styles, each on
its own content, and keeps ShapesEval (held-out concepts of every shape, on black).

What earlier designs measured (docs/benchmarks.md, ``sft_merge``): restyling the same
prompts in both domains can only average two changes of one property (every merge lost
one style); styles named by a colour word and measured on prompts that name it leaked
(an SFT that never saw the other domain's colour word drew its own style for it, so the
two SFTs disagreed on every style prompt and no merge kept either).

The style classifier is the named background colour nearest the image's median pixel
(one object covers well under half of the image).
"""

from __future__ import annotations

import io
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from krea2.curate.shapes import BACKGROUND_COLORS, WORLD_BACKGROUNDS, Concept
from krea2.pipeline.evaluation import content_prompt
from krea2.trainer import JobConfig

# domain -> (shape whose prompts it owns, its background style)
DOMAINS: dict[str, tuple[str, str]] = {"A": ("circle", "maroon"), "B": ("square", "teal")}
REPLAY_STYLES = WORLD_BACKGROUNDS  # the one-object world's (and the base's) backgrounds
# The SFT sets' caption formats: "short" is the content prompt (no background clause), so
# each set teaches what a prompt that names no background gets; the others name it.
CAPTION_WEIGHTS = {"short": 0.5, "medium": 0.3, "long": 0.2}
STYLES = tuple(BACKGROUND_COLORS)  # what the style classifier can answer


MERGES = ("uniform", "weighted", "ties", "task")  # what a merge may be called


@dataclass(frozen=True)
class SftMergeSettings:
    """Sizes of the stage: LoRA SFT steps per domain, batch, learning rate and rank;
    renders per concept in each domain set (``copies`` of every concept a domain does not
    own, ``own_factor`` x as many of its own, ``unowned_factor`` x as many of those no
    domain owns); sampling steps, CFG and seeds; style prompts per domain; TIES density; the
    weighted merge's weight of domain A."""

    steps: int = 150
    batch_size: int = 32
    lr: float = 5e-3
    rank: int = 8
    copies: int = 2
    own_factor: int = 3
    unowned_factor: int = 1
    sample_steps: int = 16
    cfg: float = 2.0
    seeds: tuple[int, ...] = (0, 1)
    style_prompts: int = 12
    density: float = 0.5
    weight_a: float = 0.6
    chain_merge: str = "ties"  # what the chain continues from: uniform, weighted, ties, task

    def __post_init__(self) -> None:
        if self.chain_merge not in MERGES:
            raise ValueError(f"chain_merge={self.chain_merge!r} is not one of {', '.join(MERGES)}")


def background_style(image: np.ndarray) -> str:
    """The named background colour (of :data:`STYLES`) nearest the median pixel of a uint8
    image [H, W, 3]."""
    median = np.median(image.reshape(-1, 3).astype(np.float64), axis=0)
    dist = {s: float(np.abs(median - np.array(BACKGROUND_COLORS[s])).sum()) for s in STYLES}
    return min(dist, key=lambda s: dist[s])


def domain_concepts(train: list[Concept], domain: str) -> list[Concept]:
    """The training concepts whose prompts ``domain`` owns (its shape)."""
    shape = DOMAINS[domain][0]
    return [c for c in train if c[1] == shape]


def write_domain_shards(
    root: Path,
    train: list[Concept],
    domain: str,
    side: int,
    copies: int,
    seed: int,
    batch_size: int,
    own_factor: int = 3,
    unowned_factor: int = 1,
) -> Path:
    """Parquet shards (curate's export, whole batches of ``batch_size``: the SFT's) of
    ``domain``'s set: its own concepts on its style (``own_factor * copies`` jittered large
    renders each) and every training concept it does not own on the base's backgrounds
    (``copies`` each; ``unowned_factor * copies`` of those no domain owns); every sample's
    ``short`` caption is its content prompt (:func:`content_prompt`). ValueError when the
    set is smaller than one batch."""
    from PIL import Image

    from krea2.curate import Sample, export_shards, shapes

    rng = np.random.default_rng(seed)
    owned = domain_concepts(train, domain)
    # a domain owns a quarter of the concepts: its own scenes 3x as often (docs/benchmarks.md
    # sft_merge: at 2x the teal SFT moved only 0.17-0.38 of its squares off black)
    scenes = [(c, DOMAINS[domain][1]) for c in owned for _ in range(own_factor * copies)]
    # A shape no domain owns is only replay in both sets; unowned_factor > 1 keeps its share
    # nearer pretraining's (docs/design/demo.md, "Where the SFT step loses with CFG").
    owned_shapes = {shape for shape, _ in DOMAINS.values()}  # by one domain or the other
    replays = {c: copies * (1 if c[1] in owned_shapes else unowned_factor) for c in train}
    scenes += [(c, str(rng.choice(REPLAY_STYLES))) for c in train if c not in owned
               for _ in range(replays[c])]  # fmt: skip
    samples = []
    for i, (concept, bg) in enumerate(scenes):
        jitter = tuple(float(x) for x in rng.uniform(-0.3, 0.3, 2))
        scene = shapes.concept_scene(concept, bg, "large", jitter)
        buf = io.BytesIO()
        Image.fromarray(shapes.render(scene, side, side)).save(buf, format="PNG")
        caps = shapes.captions(scene) | {"short": content_prompt(concept)}
        samples.append(Sample(f"{domain}-{i}", buf.getvalue(), caps))
    if len(samples) < batch_size:
        raise ValueError(
            f"domain {domain}'s set has {len(samples)} samples, fewer than one batch of "
            f"{batch_size}: give more training concepts or copies"
        )
    export_shards(samples, root, f"p{side}", side, seed=seed, batch_size=batch_size)
    return root


def sft_job(job: JobConfig, index: int, domain: str, data: Path, s: SftMergeSettings,
            run_dir: Path) -> JobConfig:  # fmt: skip
    """Stage ``index`` of ``job`` (finished) continued by one LoRA stage on ``data``
    (:func:`krea2.trainer.continuation_job`), at its resolution, patch and time shift;
    checkpoints only at the end, no tracker. Link the continued stage with
    :func:`krea2.trainer.link_finished` before training."""
    from krea2.trainer import LoraConfig, ScheduleConfig, continuation_job

    stage = replace(
        job.stages[index],
        name=f"sft-{domain}",
        data=[f"{data}/shard-*.parquet"],
        eval_data=[],
        steps=s.steps,
        batch_size=s.batch_size,
        lr=s.lr,
        lora=LoraConfig(rank=s.rank, alpha=float(s.rank)),
        caption_weights=dict(CAPTION_WEIGHTS),
        schedule=ScheduleConfig(warmup_steps=max(1, s.steps // 10), decay_ratio=0.2),
    )
    return continuation_job(
        job, index, stage, run_dir, checkpoint_every=0, keep_last=1, log_every=10, tracker="none"
    )


def style_prompts(train: list[Concept], domain: str, most: int) -> list[str]:
    """Content prompts (:func:`content_prompt`) of up to ``most`` of ``domain``'s concepts,
    spread over them: the prompts its style is measured on."""
    owned = domain_concepts(train, domain)
    return [content_prompt(c) for c in owned[:: max(1, len(owned) // most)][:most]]


def domain_sfts(job: JobConfig, index: int, work: Path, train: list[Concept],
                s: SftMergeSettings) -> list[Path]:  # fmt: skip
    """One LoRA SFT of stage ``index`` of ``job`` (finished) per domain of :data:`DOMAINS`,
    each merged into its base: ``work/sft-{domain}.safetensors`` in :data:`DOMAINS` order.
    A finished file is kept; a run under ``work/run-{domain}`` resumes."""
    from krea2.infra import CheckpointManager
    from krea2.trainer import Trainer, export_adapter, link_finished, stage_root

    side = job.stages[index].resolution
    files = []
    for n, domain in enumerate(DOMAINS):
        out = work / f"sft-{domain}.safetensors"
        if not out.is_file():
            data = write_domain_shards(work / f"data-{domain}", train, domain, side, s.copies,
                                       n, s.batch_size, s.own_factor, s.unowned_factor)  # fmt: skip
            sft = sft_job(job, index, domain, data, s, work / f"run-{domain}")
            link_finished(job, index, sft.run_dir)
            Trainer(sft, resume=True).run()
            last = len(sft.stages) - 1
            root = CheckpointManager(stage_root(sft, sft.stages[last]))
            # the adapter merged into its base (the continued stage): the domain's model
            export_adapter(sft, last, root.path_of(root.latest_step()), out, "krea-merged")
        files.append(out)
    return files


def run_sft_merge(
    job: JobConfig,
    index: int,
    work: Path,
    train: list[Concept],
    held_out: list[Concept],
    s: SftMergeSettings,
) -> dict:
    """Domain SFT of stage ``index`` of ``job`` (finished) for each of :data:`DOMAINS`, the
    merges (uniform, weighted, TIES, task arithmetic), and per model the
    style shares on each domain's prompts and ShapesEval on ``held_out``. Each SFT run
    resumes under ``work``. Returns a JSON-able dict: ``models`` (name -> style_A,
    style_B, styles seen per domain, shapes_eval), ``samples`` (name -> .npy of uint8
    [2 domains, prompts, H, W, 3], first seed), ``settings`` and ``seconds``."""
    import torch

    from krea2.curate.shapes import concept_scene, eval_prompt, shapes_eval
    from krea2.infra import CheckpointManager
    from krea2.trainer import (
        average,
        load_stage_module,
        sample_module,
        stage_root,
        task_arithmetic,
        ties_merge,
    )

    start = time.perf_counter()
    work.mkdir(parents=True, exist_ok=True)
    base_root = CheckpointManager(stage_root(job, job.stages[index]))
    base_step = base_root.latest_step()
    if base_step is None:
        raise FileNotFoundError(f"the base stage has no checkpoint under {base_root.root}")
    base_dir = base_root.path_of(base_step)
    weights = {"base": average([base_dir])}
    module = load_stage_module(job, index)  # the base's text conditioning for every model
    merged_files = domain_sfts(job, index, work, train, s)
    for domain, out in zip(DOMAINS, merged_files, strict=True):
        weights[f"SFT {domain} ({DOMAINS[domain][1]})"] = average([out])
    weights["uniform merge"] = average(merged_files)
    wa = s.weight_a
    weights[f"weighted merge {wa:g}/{1 - wa:g}"] = average(merged_files, [wa, 1 - wa])
    weights[f"TIES merge (density {s.density:g})"] = ties_merge(
        base_dir, merged_files, density=s.density
    )
    # Task arithmetic (Ilharco et al. 2023) at scale 1: base + both task vectors in full,
    # what stacking the two adapters at strength 1 gives.
    weights["task arithmetic (A + B - base)"] = task_arithmetic(base_dir, merged_files)

    prompts = {d: style_prompts(train, d, s.style_prompts) for d in DOMAINS}
    eval_scenes = [concept_scene(c) for c in held_out]
    eval_prompts = [eval_prompt(c) for c in held_out]
    seeds = list(s.seeds)
    models, samples = {}, {}
    (work / "samples").mkdir(exist_ok=True)
    for name, state in weights.items():
        module.dit.load_state_dict({k: v.to(torch.float32) for k, v in state.items()})
        row: dict = {"styles_seen": {}}
        firsts = []
        # every domain's style prompts and the held-out prompts in one sampling call (an
        # image does not depend on its batch; fuller forwards sample faster)
        everything = [p for d in DOMAINS for p in prompts[d]] + eval_prompts
        all_imgs = sample_module(job, index, module, everything, seeds, s.sample_steps, s.cfg)
        at = 0
        for d, (_, style) in DOMAINS.items():
            imgs = all_imgs[at : at + len(prompts[d])]
            at += len(prompts[d])
            seen = [background_style(im) for per_prompt in imgs for im in per_prompt]
            row[f"style_{d}"] = sum(x == style for x in seen) / len(seen)
            row["styles_seen"][d] = {x: seen.count(x) for x in STYLES if x in seen}
            firsts.append(imgs[:, 0])
        imgs = all_imgs[at:]
        scored = shapes_eval(imgs, eval_scenes)
        row["shapes_eval"] = float(scored.score)
        row["shapes_eval_per_image"] = scored.per_image  # [prompts][seeds]
        base_scores = models["base"]["shapes_eval_per_image"] if models else scored.per_image
        row.update(paired_delta(scored.per_image, base_scores))
        path = work / "samples" / f"{len(samples):02d}.npy"
        np.save(path, np.stack(firsts))
        models[name], samples[name] = row, str(path)
    return {
        "models": models,
        "samples": samples,
        "prompts": prompts,
        "settings": {k: getattr(s, k) for k in s.__dataclass_fields__},
        "seconds": time.perf_counter() - start,
    }


def paired_delta(scores: list[list[float]], base: list[list[float]]) -> dict[str, float]:
    """:func:`krea2.pipeline.evaluation.paired_delta` as ``shapes_eval_delta`` and
    ``shapes_eval_delta_se`` (a model's ShapesEval minus the base's, same prompts and seeds)."""
    from krea2.pipeline.evaluation import paired_delta as delta

    d = delta(scores, base)
    return {"shapes_eval_delta": d["delta"], "shapes_eval_delta_se": d["se"]}


# -- the demo stage ---------------------------------------------------------------------

STAGE = "sft-merge"
WHAT = "domain SFT (circles on maroon, squares on teal) and merges of the two"


def demo_settings(cfg) -> SftMergeSettings:
    """The stage's sizes for a demo recipe (``cfg``: DemoConfig): sampling is ``[eval]``'s
    (steps, CFG, its seeds); a smoke run (``--quick``) trains 4 steps per domain on small
    sets and samples one seed, enough to check that the stage runs and reports."""
    ev = cfg.eval
    # [eval]'s first 3 seeds: one seed's style shares swing by up to half (the same merge
    # drew 5 of 12 circles maroon with seed 0, 22 of 24 with seeds 1-2), and 3 seeds cost
    # ~75 s more than one; all 8 cost ~150 s more than 3 on 2 cores for 7 models, which the
    # demo's 30 minutes cannot hold. The chain's SFT model is measured on every [eval] seed
    # by the chain stage.
    common = {"sample_steps": ev.steps, "cfg": ev.cfg, "seeds": tuple(ev.seeds[:3])}
    if cfg.smoke:
        common["seeds"] = tuple(ev.seeds[:1])
        return SftMergeSettings(steps=2, batch_size=4, copies=1, style_prompts=2, **common)
    # 4 renders per replayed concept (12 per own), 100 steps at lr 2e-3; the chain continues
    # from the uniform merge (docs/design/trainer.md). With 2 renders and 150 steps (~16
    # passes over 288 images) the teal SFT memorised its set: -0.188 +- 0.057 with CFG 3 (28
    # held-out prompts x 3 seeds, paired with the base). At lr 5e-3 the chain's uniform merge
    # lost 0.036 +- 0.034 (Intel AMX) and 0.046 +- 0.040 (AMD, fp32) with CFG (8 seeds),
    # all in triangles, the shape no domain owns; at lr 2e-3 it held ShapesEval in all three
    # measurements (-0.007 +- 0.030 and, weighted, +0.001 +- 0.031 on Intel; -0.009 +- 0.026
    # on AMD), at the price of weaker styles (docs/design/demo.md, "Where the SFT step loses
    # with CFG"; benchmarks/sft_replay.py).
    return SftMergeSettings(steps=100, batch_size=32, lr=2e-3, copies=4, style_prompts=12,
                            chain_merge="uniform", **common)  # fmt: skip


def run_demo_stage(cfg, job: JobConfig, work: Path, train, held_out) -> dict:
    """The demo's ``sft-merge`` stage from the final pretraining stage of ``job``; a smoke
    run's domain sets use every 8th training concept (it checks the stage runs, in
    seconds). The recipe's merge (``chain_merge``) becomes stage ``sft`` of the run
    ``work/chain``: the chain's SFT model (``model`` in the result)."""
    from krea2.pipeline.chain import adopt_merge, model_record

    train = list(train)[:: 8 if cfg.smoke else 1]
    s, index = demo_settings(cfg), len(job.stages) - 1
    result = run_sft_merge(job, index, work, train, list(held_out), s)
    chain = adopt_merge(job, index, work, s, [work / f"sft-{d}.safetensors" for d in DOMAINS])
    result["model"] = model_record(chain, len(chain.stages) - 1)
    result["chain_merge"] = s.chain_merge
    return result


def summary(result: dict) -> dict:
    """summary.json's ``sft_merge``: per model its style shares and ShapesEval."""
    keys = ("style_A", "style_B", "shapes_eval", "shapes_eval_delta", "shapes_eval_delta_se")
    return {name: {k: m[k] for k in keys if k in m} for name, m in result["models"].items()} | {
        "seconds": result["seconds"]
    }
