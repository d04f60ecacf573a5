"""Demo stage ``style``: a style-reference module on raw, trained three ways and measured.

Each variant trains the trainer's ``style`` objective after raw's stage in a run of its
own (:func:`krea2.trainer.style_job`; raw frozen, only the module trains) on the same
styled training shards (:mod:`krea2.pipeline.style_data`), differing only in what the
module sees as a training image's reference: **R** the image itself (reconstruction, the
leakage baseline), **S** the image with its salient pixels painted over and its tiles
shuffled (self-supervised: style kept, content destroyed, no labels), **O** another
render of the same style (oracle, an upper bound).

Measured on held-out prompts x held-out references, raw sampled without CFG (raw's own
setting) at ``[eval]``'s steps and seeds: style similarity (background kind and colour,
and the toy CSD's cosine), leakage (outputs holding an object of the reference that the
prompt did not ask for; the layout's IoU with the reference beyond chance), content
(ShapesEval against the prompt) against raw with no reference; for S also a strength
sweep (Spearman ρ of s and style similarity; s = 0 must equal no reference pixel for
pixel) and mixing of two references at (α, 1 − α). Everything is kept under ``work``.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from krea2.pipeline.evaluation import paired_delta
from krea2.pipeline.style_data import StyleCase, style_cases, write_style_shards
from krea2.trainer import JobConfig, ReferenceMode

STAGE = "style"
WHAT = "train a style-reference module on raw (reconstruction, self-supervised, oracle)"
VARIANTS = {"R": ReferenceMode.RECONSTRUCT, "O": ReferenceMode.PAIRED}  # S: settings'
ALIGNED = "S+PO"  # S after preference alignment (krea2.pipeline.style_align)


def variant_modes(s: Any) -> dict[str, ReferenceMode]:
    """Variant letter -> reference mode: R, S (the recipe's ``module.reference``), O."""
    return {"R": VARIANTS["R"], "S": ReferenceMode(s.module.reference), "O": VARIANTS["O"]}


def train_variants(s: Any, base: tuple[JobConfig, int], work: Path, concepts: list) -> dict:
    """Train (or resume, or find finished) each variant of ``s.variants``; returns letter ->
    (job, stage index) and the seconds each took."""
    from krea2.trainer import style_job, train_style

    job0, index = base
    side = job0.stages[index].resolution
    shards = write_style_shards(work / "shards", concepts, s.train_images, side, s.seed,
                                s.batch_size, tuple(s.object_styles), s.uncaptioned)  # fmt: skip
    modes, models, seconds = variant_modes(s), {}, {}
    for letter in s.variants:
        settings = replace(s.module, reference=modes[letter])
        job = style_job(job0, index, work / f"variant-{letter}", shards, settings, s.steps,
                        s.batch_size, s.lr, keep_last=1, caption_weights=s.caption_weights,
                        caption_dropout=s.caption_dropout)  # fmt: skip
        t = time.perf_counter()
        train_style(job0, index, job)
        seconds[letter] = time.perf_counter() - t
        models[letter] = (job, len(job.stages) - 1)
    return {"models": models, "seconds": seconds}


class Sampler:
    """Samples of one loaded style module (or of raw) for the cases, cached as ``.npy``."""

    def __init__(self, model: tuple[JobConfig, int], seeds: list[int], steps: int) -> None:
        from krea2.trainer import load_stage_module

        self.job, self.index = model
        self.module = load_stage_module(self.job, self.index)
        self.seeds, self.steps = seeds, steps

    def __call__(self, path: Path, prompts: list[str], refs=None, strengths=None,
                 seeds: list[int] | None = None) -> np.ndarray:  # fmt: skip
        """uint8 [P, S, H, W, 3]; ``refs`` latents [P, R, C, h, w], ``strengths`` [P, R];
        ``seeds`` None: the sampler's."""
        import torch

        from krea2.infra.atomic import cached_array
        from krea2.trainer import sample_module

        style = None
        if refs is not None:
            style = (refs, torch.as_tensor(np.asarray(strengths), dtype=torch.float32))
        return cached_array(path, lambda: sample_module(
            self.job, self.index, self.module, prompts, seeds or self.seeds, self.steps, 0.0,
            style=style,
        ))  # fmt: skip


def per_image_measures(images: np.ndarray, cases: list[StyleCase], csd: Any) -> dict:
    """Per-image [P][S] lists: ``similarity`` and its two halves ``kind`` (the background
    kind matches, 0/1) and ``colour`` (exp(−distance / 40)), ``csd`` (cosine with the
    reference's toy-CSD embedding), ``leaked`` (0/1), ``layout`` (reference IoU − chance),
    ``content``."""
    from krea2.curate.shapes import leakage, read_style, shapes_eval, style_similarity

    side = images.shape[2]
    refs = np.stack([c.reference_pixels(side) for c in cases])
    ref_emb = csd.embed(refs)
    names = ("similarity", "kind", "colour", "csd", "leaked", "layout")
    out: dict[str, list] = {k: [] for k in names}
    for case, row, ref, emb in zip(cases, images, refs, ref_emb, strict=True):
        ref_style = read_style(ref)  # once per case, not once per sample
        scores = [style_similarity(img, ref_style) for img in row]
        leaks = [leakage(img, case.reference, case.target) for img in row]
        out["similarity"].append([x.similarity for x in scores])
        out["kind"].append([float(x.kind_match) for x in scores])
        out["colour"].append([x.colour for x in scores])
        out["csd"].append([float(e @ emb) for e in csd.embed(row)])
        out["leaked"].append([float(bool(x.leaked)) for x in leaks])
        out["layout"].append([x.layout_leak for x in leaks])
    out["content"] = shapes_eval(images, [c.prompt for c in cases]).per_image
    return out


def _ranks(v: list[float]) -> np.ndarray:
    """Ranks 0..n-1 of ``v``, ties given their average rank."""
    a = np.asarray(v, np.float64)
    order = np.argsort(a, kind="stable")
    ranks = np.empty(len(a))
    ranks[order] = np.arange(len(a))
    for value in np.unique(a):
        tied = a == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's ρ of two equal-length sequences (average ranks for ties; 0 when either
    is constant)."""
    rx, ry = _ranks(x), _ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return 0.0
    # rounded: one swap of 5 ranks is exactly 0.9, which corrcoef gives as 0.8999999999999998
    return round(float(np.corrcoef(rx, ry)[0, 1]), 12)


def _mean(m: dict) -> dict[str, float]:
    return {k: float(np.mean(v)) for k, v in m.items()}


def measure(s: Any, trained: dict, raw: tuple[JobConfig, int], work: Path, cases: list[StyleCase],
            seeds: list[int], steps: int, csd: Any) -> dict:  # fmt: skip
    """Every variant with its reference at s = 1 against raw without one; S's strength
    sweep and mixing (module docstring). Returns the JSON-able result."""
    import torch

    from krea2.trainer import encode_images

    job0, _ = raw
    side = job0.stages[raw[1]].resolution
    prompts = [c.prompt for c in cases]
    refs = encode_images(job0, np.stack([c.reference_pixels(side) for c in cases]))[:, None]
    # "none" is the variants' own base without a reference: raw as a style stage loads it
    # (a LoRA raw's adapters merged), so s = 0 can be compared with it pixel for pixel
    first = next(iter(trained["models"].values()))
    base = Sampler(first, seeds, steps)(work / "none.npy", prompts)
    base_m = per_image_measures(base, cases, csd)
    result: dict[str, Any] = {"none": {"mean": _mean(base_m), "per_image": base_m}}
    ones = [[1.0]] * len(cases)
    for letter, model in trained["models"].items():
        sampler = Sampler(model, seeds, steps)
        images = sampler(work / f"{letter}-s1.0.npy", prompts, refs, ones)
        m = per_image_measures(images, cases, csd)
        result[letter] = {
            "mean": _mean(m),
            "per_image": m,
            "vs_none": {k: paired_delta(m[k], base_m[k]) for k in m},
        }
        if letter == ALIGNED and "S" in result:  # the alignment's own effect: paired with S
            result[letter]["vs_S"] = {k: paired_delta(m[k], result["S"]["per_image"][k]) for k in m}
        if letter != "S":
            continue
        # the sweep and the mixing on the first seeds: curves, not the verdicts above
        few = seeds[: s.sweep_seeds]
        n = len(few)
        sweep = {}
        for strength in map(float, s.strengths):
            path = work / f"S-s{strength}{'' if n == len(seeds) else f'-{n}seeds'}.npy"
            images = sampler(path, prompts, refs, [[strength]] * len(cases), few)
            sweep[str(strength)] = _mean(per_image_measures(images, cases, csd))
            if strength == 0:
                same = np.array_equal(images, base[:, :n])
                sweep[str(strength)]["identical_to_none"] = float(same)
        xs = [float(k) for k in sweep]
        result["strength"] = {
            "sweep": sweep,
            "rho": spearman(xs, [sweep[k]["similarity"] for k in sweep]),
            "rho_csd": spearman(xs, [sweep[k]["csd"] for k in sweep]),
        }
        # mixing: case i's reference (A) with case i+1's (B) at weights (α, 1 − α)
        other = torch.roll(refs, -1, dims=0)
        pair = torch.cat([refs, other], dim=1)  # [P, 2, C, h, w]
        others = cases[1:] + cases[:1]
        mix = {}
        for alpha in map(float, s.mix):
            images = sampler(work / f"S-mix{alpha}-{n}seeds.npy", prompts, pair,
                             [[alpha, 1 - alpha]] * len(cases), few)  # fmt: skip
            a = per_image_measures(images, cases, csd)
            b = per_image_measures(images, others, csd)
            mix[str(alpha)] = {
                "toward_a": float(np.mean(a["similarity"]) - np.mean(b["similarity"])),
                "toward_a_csd": float(np.mean(a["csd"]) - np.mean(b["csd"])),
            }
        xs = [float(k) for k in mix]
        result["mixing"] = {
            "by_alpha": mix,
            "rho": spearman(xs, [mix[k]["toward_a"] for k in mix]),
            "rho_csd": spearman(xs, [mix[k]["toward_a_csd"] for k in mix]),
        }
    return result


def run_demo_stage(s: Any, raw: tuple[JobConfig, int], work: Path, train_concepts: list,
                   held_out: list, seeds: list[int], steps: int) -> dict:  # fmt: skip
    """Train the variants on ``train_concepts`` and measure them on ``held_out`` (module
    docstring). Returns the JSON-able result."""
    from krea2.curate.shapes import StyleEncoder, train_style_encoder

    work.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    trained = train_variants(s, raw, work, train_concepts)
    t_train = time.perf_counter() - t
    csd_dir = work / "csd"
    if (csd_dir / "config.json").exists():
        csd = StyleEncoder.load(csd_dir)
    else:
        csd = train_style_encoder(seed=s.seed, steps=s.csd_steps, size=64)
        csd.save(csd_dir)
    cases = style_cases(held_out, train_concepts, s.eval_cases, s.seed + 1,
                        tuple(s.object_styles))  # fmt: skip
    align_info: dict = {}
    if s.align.steps > 0 and "S" in trained["models"]:
        from krea2.pipeline.style_align import align_style

        t = time.perf_counter()
        align_cases = style_cases(train_concepts, train_concepts, s.align.cases, s.align.seed,
                                  tuple(s.object_styles))  # fmt: skip
        align_info = align_style(s.align, trained["models"]["S"], work / "align", align_cases,
                                 csd, steps, per_image_measures, Sampler)  # fmt: skip
        trained["models"][ALIGNED] = align_info.pop("model")
        trained["seconds"][ALIGNED] = time.perf_counter() - t
        t_train += trained["seconds"][ALIGNED]
    side = raw[0].stages[raw[1]].resolution
    from krea2.infra.atomic import cached_array

    cached_array(work / "references.npy",
                 lambda: np.stack([c.reference_pixels(side) for c in cases]))  # fmt: skip
    t = time.perf_counter()
    result = measure(s, trained, raw, work, cases, seeds, steps, csd)
    result["seconds"] = {"train": t_train, "measure": time.perf_counter() - t,
                         **{f"train_{k}": v for k, v in trained["seconds"].items()}}  # fmt: skip
    result["prompts"] = [c.prompt for c in cases]
    result["work"] = str(work)
    result["settings"] = {"steps": s.steps, "batch_size": s.batch_size, "lr": s.lr,
                          "train_images": s.train_images, "seeds": seeds,
                          "reference_S": str(s.module.reference)}  # fmt: skip
    if ALIGNED in result:
        result[ALIGNED]["pairs"] = align_info
    result["checks"] = checks(result)
    return result


def checks(r: dict) -> dict[str, dict]:
    """The issue's must-shows as (value, bound, holds)."""
    out: dict[str, dict] = {}
    if "S" in r and "R" in r:
        leak_s, leak_r = r["S"]["mean"]["leaked"], r["R"]["mean"]["leaked"]
        out["leakage"] = {"S": leak_s, "R": leak_r,
                          "holds": leak_s <= 0.05 and leak_s <= 0.25 * leak_r}  # fmt: skip
    if "S" in r and "O" in r:
        sim_s, sim_o = r["S"]["mean"]["similarity"], r["O"]["mean"]["similarity"]
        out["style"] = {"S": sim_s, "O": sim_o, "holds": sim_s >= 0.9 * sim_o}
    if "S" in r:
        d = r["S"]["vs_none"]["content"]
        out["content"] = {**d, "holds": d["delta"] >= -0.03}
    if "strength" in r:
        zero = r["strength"]["sweep"].get("0.0", r["strength"]["sweep"].get("0", {}))
        out["strength"] = {"rho": r["strength"]["rho"],
                           "identical_at_0": zero.get("identical_to_none"),
                           "holds": r["strength"]["rho"] >= 0.9
                           and zero.get("identical_to_none") == 1.0}  # fmt: skip
    if "mixing" in r:
        out["mixing"] = {"rho": r["mixing"]["rho"], "holds": r["mixing"]["rho"] >= 0.9}
    if ALIGNED in r and "vs_S" in r[ALIGNED]:
        # lower leakage or higher style similarity, each resolved by its paired standard
        # error, with ShapesEval no more than one standard error below S's
        d = r[ALIGNED]["vs_S"]
        sim, leak, content = d["similarity"], d["leaked"], d["content"]
        better = sim["delta"] - sim["se"] > 0 or leak["delta"] + leak["se"] < 0
        out["alignment"] = {"similarity": sim["delta"], "similarity_se": sim["se"],
                            "leaked": leak["delta"], "content": content["delta"],
                            "content_se": content["se"],
                            "holds": better and content["delta"] >= -content["se"]}  # fmt: skip
        # the parts, shown beside the verdict (which reads the whole similarity alone)
        for part in ("kind", "colour", "csd"):
            if part in d:
                out["alignment"][part] = d[part]["delta"]
                out["alignment"][f"{part}_se"] = d[part]["se"]
    return out
