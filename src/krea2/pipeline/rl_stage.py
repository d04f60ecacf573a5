"""Demo stage ``rl``: the chain's PO model RL-tuned without CFG into raw, the final model
(``krea2.rl.online.rl_stage``: DiffusionNFT or GRPO, the rubric verifier + the artifact
reward aggregated by GDPO, a curated prompt pool of training-concept prompts), measured on
the held-out prompts with and without CFG against its start (the rows say "pretrained":
the model the stage started from)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from krea2.curate.shapes import Concept, concept_scene, eval_prompt
from krea2.pipeline.config import DemoConfig, RlPromptSpec
from krea2.pipeline.evaluation import content_prompt
from krea2.trainer import JobConfig

STAGE = "rl"
REWARD_CURVES = ("reward_rubric", "reward_shape", "reward_artifact")  # logged per iteration
WHAT = "RL without CFG (multi-reward, GDPO) from the STPO model: the final model, raw"
HEADERS = ["model", "ShapesEval, no CFG", "all correct, no CFG", "ShapesEval, CFG",
           "all correct, CFG", "artifact reward, no CFG", "background noise, no CFG"]  # fmt: skip


def run_demo_stage(
    cfg: DemoConfig, job: JobConfig, work: Path, train: list[Concept], held_out: list[Concept],
    start_samples: dict[str, Path] | None = None,
) -> dict:  # fmt: skip
    """RL-tune ``job``'s final stage with the recipe's ``[rl]`` settings, evaluated as
    ShapesEval does (``[eval]``'s steps, seeds and CFG); resumable under ``work``.
    ``start_samples``: ``job``'s held-out samples already drawn that way (``"cfg"`` ->
    ``.npy``: the preference stage's), measured instead of sampled again."""
    from krea2.rl.online import rl_stage

    s = replace(cfg.rl, eval_steps=cfg.eval.steps, eval_cfg=cfg.eval.cfg,
                eval_seeds=list(cfg.eval.seeds))  # fmt: skip
    return rl_stage(
        job, len(job.stages) - 1, work, training_prompts(train, cfg.rl_prompts),
        [eval_prompt(c) for c in held_out], [concept_scene(c) for c in held_out], s,
        start_samples=start_samples,
    )  # fmt: skip


def training_prompts(train: list[Concept], spec: RlPromptSpec) -> list[str]:
    """One prompt per training concept: its content prompt (no background clause) for a
    ``spec.content_share`` of them, drawn per concept from ``spec.seed``, else its
    ShapesEval prompt. A share of 0 gives exactly the ShapesEval prompts."""
    draws = np.random.default_rng([spec.seed, 17]).random(len(train))
    return [
        content_prompt(c) if u < spec.content_share else eval_prompt(c)
        for c, u in zip(train, draws, strict=True)
    ]


def rows(result: dict) -> list[list[str]]:
    """Rows of :data:`HEADERS`: the pretrained model, then the RL-tuned one."""
    out = []
    for label, key in (("pretrained", "pretrained"), (f"RL ({result['objective']})", "tuned")):
        m = result[key]
        cfg = m.get("cfg")
        out.append([
            label, f"{m['no_cfg']['shapes_eval']:.3f}", f"{m['no_cfg']['all_correct']:.3f}",
            f"{cfg['shapes_eval']:.3f}" if cfg else "", f"{cfg['all_correct']:.3f}" if cfg else "",
            f"{m['no_cfg']['artifact']:.3f}",
            f"{m['no_cfg']['bg_noise']:.2f}" if "bg_noise" in m["no_cfg"] else "",
        ])  # fmt: skip
    return out


def summary(result: dict) -> dict:
    """summary.json's ``rl``: the pool verdicts, pretrained and tuned measures (no CFG and
    CFG), whether the guard stopped the run, the last logged rewards and seconds."""
    strip = ("samples",)
    measures = {
        key: {k: {f: v for f, v in m.items() if f not in strip} for k, m in result[key].items()}
        for key in ("pretrained", "tuned")
    }
    c = result["curves"]
    return {
        "objective": result["objective"],
        "pool": result["pool"],
        **measures,
        "stopped": result["stopped"],
        "last_rewards": {k: c[k][-1] for k in REWARD_CURVES if c.get(k) and c[k][-1] is not None},
        "seconds": result["seconds"],
    }


def summary_line(result: dict) -> str:
    pre, post = result["pretrained"], result["tuned"]
    cfg = f", CFG {pre['cfg']['shapes_eval']:.3f} before" if pre.get("cfg") else ""
    stop = f"  (stopped: {result['stopped']})" if result["stopped"] else ""
    return (
        f"RL ({result['objective']}) ShapesEval without CFG {pre['no_cfg']['shapes_eval']:.3f}"
        f" -> {post['no_cfg']['shapes_eval']:.3f}{cfg}{stop}"
    )


def report_section(result: dict, prompts: list[str], upscale) -> str:  # type: ignore[no-untyped-def]
    """The RL stage on report.html: ShapesEval with and without CFG before and after, the
    reward curves per reward and the held-out no-CFG curve, and the first seed's samples
    without CFG (pretrained, then RL-tuned)."""
    from krea2.pipeline import html

    parts = [html.table(HEADERS, rows(result))]
    counts = ", ".join(f"{v} {k}" for k, v in result["pool"].items())
    st = result["settings"]
    g = st.get("grpo", st)  # the objective's settings (flat in results written before)
    pool = (
        f"{result.get('pool_prompts', '?')} entries drawn from: the kept prompts"
        + (", the never-solved ones" if st.get("keep_unsolved") else "")
        + (", the always-solved ones" if st.get("keep_solved") else "")
        + (
            f", the hardest up to {st['hard_repeats']} x as often"
            if st.get("hard_repeats", 1) > 1
            else ""
        )
    )
    parts.append(
        f'<p class="note">Prompt pool: {counts} (curated from no-CFG samples of the '
        f"training-concept prompts; the record of why is pool.json); trained on {pool}. "
        f"DiffusionNFT loss weighting: {g.get('nft_weighting', 'velocity')}. Rewards: the rubric "
        "verifier, the artifact reward (1 − P(defect), its head calibrated on the "
        "starting model's own samples) and, where weighted, the dense shape "
        f"fidelity (weights {g.get('weights')}), aggregated by "
        f"{g.get('aggregation', 'normalize_then_sum')}; DiffusionNFT's old "
        f"policy decay {g.get('nft_old_decay', 0)}; sampling without CFG during "
        "training. Background noise: mean |high-pass| over the plain background in grey "
        "levels (krea2.rl.online.background_noise), which no reward sees; reward hacking "
        "laid a grid over it (~9 against ~0.5); the guard stops the run above "
        f"{g.get('noise_bound')} x the start.</p>"
    )
    if result["stopped"]:
        parts.append(f'<p class="warning">{html.escape(result["stopped"])}</p>')
    c = result["curves"]
    series = {
        f"reward {k.removeprefix('reward_')}": [
            (s, v) for s, v in zip(c["step"], c[k], strict=True) if v is not None
        ]
        for k in REWARD_CURVES
        if c.get(k)
    }
    evals = [(s, v) for s, v in zip(c["step"], c["eval_shapes"], strict=True) if v is not None]
    if evals:
        series["held-out ShapesEval, no CFG"] = evals
    if any(series.values()):
        parts.append(
            "<h3>Rewards per iteration</h3>"
            + html.line_chart(
                {k: v for k, v in series.items() if v},
                x_label="iteration",
                y_label="mean",
                log=False,
            )
        )
    images = [np.load(result["pretrained"]["no_cfg"]["samples"])[:8, 0],
              np.load(result["tuned"]["no_cfg"]["samples"])[:8, 0]]  # fmt: skip
    labels = ["pretrained, no CFG", f"RL ({result['objective']}), no CFG"]
    parts.append(
        "<h3>Held-out prompts, first seed, no CFG</h3>"
        + html.image_table(
            prompts[: len(images[0])],
            [
                (lab, [html.png_data_uri(upscale(im)) for im in ims])
                for lab, ims in zip(labels, images, strict=True)
            ],
        )
    )
    return "".join(parts)
