"""The training loop: stages in order, each resumable to the exact step."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from krea2.dit.parallel import tp_partial_params
from krea2.infra.checkpoint import CheckpointManager, capture_rng_state, restore_rng_state
from krea2.infra.errors import UserError
from krea2.infra.logging import get_logger
from krea2.trainer.build import (
    TrainModule,
    build_autoencoder,
    build_module,
    check_bucket,
    dit_config,
)
from krea2.trainer.cache import LatentCache
from krea2.trainer.captions import choose_captions
from krea2.trainer.config import Float8Recipe, JobConfig, SpikeAction, StageConfig
from krea2.trainer.data import ShardIndex, batch_loader
from krea2.trainer.distributed import DistEnv, all_reduce_sum, init_distributed
from krea2.trainer.evaluate import to_unit
from krea2.trainer.objective import (
    TIME_BUCKETS,
    draw_time_and_noise,
    flow_terms,
    sample_generator,
    stage_mu,
    time_bucket_sums,
    weighted_loss,
)
from krea2.trainer.observe import MetricsLog
from krea2.trainer.optim import build_optimizers, clip_grad_norm, set_lr
from krea2.trainer.parallelize import sum_tp_partial_grads
from krea2.trainer.reporting import StageReports
from krea2.trainer.schedule import wsd_factor
from krea2.trainer.stability import SpikeDetector, Verdict
from krea2.trainer.validate import resolve_files
from krea2.trainer.warmstart import stage_checkpoints, warm_start

log = get_logger("trainer")


class TrainingStopped(UserError):
    """The run stopped on purpose (too many bad steps or samples); the message says why."""


@dataclass
class StageState:
    """Per-stage loop state that is saved with every checkpoint (as JSON ``extra``)."""

    step: int = 0  # next step to run
    skip: list[int] = field(default_factory=list)  # batches never to train on (rollbacks)
    stability: dict[str, Any] | None = None


@dataclass
class StageRun:
    """What one stage's loop works on: its data, module, optimizers, checkpoints and guard."""

    stage: StageConfig
    data: ShardIndex
    module: TrainModule
    optimizers: list[torch.optim.Optimizer]
    params: list[nn.Parameter]  # the trainable ones, for clipping
    tp_partial: list[nn.Parameter]  # QK-norm scales whose grads are summed over the tp ranks
    checkpoints: CheckpointManager
    detector: SpikeDetector
    state: StageState = field(default_factory=StageState)
    encoder: nn.Module | None = None  # iREPA's frozen encoder, while iREPA is on


class Trainer:
    """Runs a :class:`JobConfig`: every stage, with checkpoints, guards and metrics.

    ``resume=True`` continues from the newest checkpoint of the first unfinished stage
    (model, optimizer, step, data position, RNG and guard state); otherwise an existing
    run directory with checkpoints is refused, so nothing is overwritten by accident.
    """

    def __init__(self, cfg: JobConfig, resume: bool = False) -> None:
        self.cfg = cfg
        self.resume = resume
        self.env: DistEnv = init_distributed(cfg)
        if cfg.parallel.deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS needs it
            torch.use_deterministic_algorithms(True)
        if cfg.parallel.threads:
            torch.set_num_threads(cfg.parallel.threads)
        self.run_dir = Path(cfg.run_dir)
        self.metrics = MetricsLog(self.run_dir / "metrics.jsonl", write=self.env.is_main)
        self.ae = build_autoencoder(cfg.model, self.env.device)
        self.latents = LatentCache(cfg.data.cache_latents)
        self.reports = StageReports(cfg, self.env, self.metrics, self.ae, self.run_dir)
        self._exporter = None
        if cfg.observe.prometheus_port is not None:
            from krea2.infra.metrics import start_exporter

            self._exporter = start_exporter(cfg.observe.prometheus_port + self.env.rank)

    def _done_marker(self, stage: StageConfig) -> Path:
        return self.run_dir / "checkpoints" / f"{stage.name}.done"

    # ------------------------------------------------------------------ run
    def run(self) -> None:
        if not self.resume:  # every rank checks, so none waits in a collective for rank 0
            existing = list((self.run_dir / "checkpoints").glob("*/step-*"))
            if existing:
                raise UserError(
                    f"{self.run_dir} already holds checkpoints; pass --resume to continue it "
                    "or choose another run_dir"
                )
        todo = [(i, s) for i, s in enumerate(self.cfg.stages) if not self._done_marker(s).exists()]
        for i, stage in enumerate(self.cfg.stages):
            if (i, stage) not in todo:
                log.info("stage %s already finished; skipping", stage.name)
        # Index every remaining stage's shards first: a broken shard or a bucket the model
        # cannot patchify fails now, not hours later when its stage begins.
        indexes = {i: self._indexes(i, s) for i, s in todo}
        for i, stage in todo:
            self.run_stage(i, stage, *indexes[i])
        if self._exporter is not None:
            self._exporter.close()

    def _state(self, module: TrainModule, optimizers: list) -> dict[str, Any]:
        return {
            "model": get_model_state_dict(module),
            "optim": get_optimizer_state_dict(module, optimizers),
        }

    def _load_state(self, mgr: CheckpointManager, module, optimizers, step=None) -> dict:
        state = self._state(module, optimizers)
        extra = mgr.load(state, step=step)
        set_model_state_dict(module, state["model"])
        set_optimizer_state_dict(module, optimizers, state["optim"])
        return extra

    def _indexes(self, i: int, stage: StageConfig) -> tuple[ShardIndex, ShardIndex | None]:
        index = ShardIndex(
            resolve_files(stage.data, f"stage {stage.name!r} data"),
            stage.batch_size,
            self.cfg.seed + 1000 * i,
            shuffle=stage.shuffle,
        )
        factor = self.ae.spatial_factor * dit_config(self.cfg, stage).patch
        for ref in {b.bucket: b for b in index.batches}.values():
            check_bucket(ref.size, factor, f"stage {stage.name!r}")
        eval_index = None
        if stage.eval_data:
            eval_index = ShardIndex(
                resolve_files(stage.eval_data, "eval_data"), stage.batch_size, 0, shuffle=False
            )
        return index, eval_index

    def run_stage(
        self, i: int, stage: StageConfig, index: ShardIndex, eval_index: ShardIndex | None
    ) -> None:
        """Train ``stage`` from its newest checkpoint (or its start) to its last step."""
        cfg, env = self.cfg, self.env
        run = self._resume_or_init(i, stage, index)
        step = run.state.step
        last_saved = step - 1
        while step < stage.steps:  # a rollback starts the loader again at the restored step
            loader = batch_loader(
                index, env.dp_rank, env.dp, step, stage.steps, cfg.data.workers, cfg.data.prefetch
            )
            restart = None
            t_prev, cpu_prev = time.perf_counter(), time.process_time()
            for batch in loader:
                step = batch["step"]
                if step in run.state.skip:
                    log.warning("step %d: skipping batch marked bad by a rollback", step)
                    step += 1
                    continue
                out, restart = self._train_step(run, batch, step)
                if restart is not None:
                    step = restart
                    break
                now, cpu_now = time.perf_counter(), time.process_time()
                out["step_time"] = now - t_prev  # wall seconds, data wait included
                out["step_cpu_time"] = cpu_now - cpu_prev  # this process's CPU seconds
                t_prev, cpu_prev = now, cpu_now
                self.reports.step(stage, run.module.dit.cfg, step, out)
                every = cfg.checkpoint.every
                if every and (step + 1) % every == 0 and step + 1 < stage.steps:
                    self._save(run, step, sync=False)
                    last_saved = step
                self.reports.periodic(stage, step, run.module, eval_index)
                step += 1
            if restart is None:
                break
        run.checkpoints.wait()
        if last_saved != stage.steps - 1:
            self._save(run, stage.steps - 1, sync=True)
        self.reports.finish(stage, run.module, eval_index)
        if env.is_main:
            self._done_marker(stage).write_text(f"{stage.steps}\n")
        if env.distributed:
            torch.distributed.barrier()

    def _resume_or_init(self, i: int, stage: StageConfig, index: ShardIndex) -> StageRun:
        """Build the stage's module and optimizers, then resume them (with the step, guard
        and RNG state) from the stage's newest checkpoint, or start from earlier weights."""
        cfg, env = self.cfg, self.env
        module = build_module(cfg, stage, env)
        lr = stage.lr if stage.lr is not None else cfg.optimizer.lr
        trainable = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        run = StageRun(
            stage=stage,
            data=index,
            module=module,
            optimizers=build_optimizers(trainable, cfg.optimizer, lr),
            params=[p for _, p in trainable],
            tp_partial=tp_partial_params(module.dit) if env.tp > 1 else [],
            checkpoints=CheckpointManager(
                stage_checkpoints(self.run_dir, stage.name),
                cfg.checkpoint.keep_last,
                cfg.checkpoint.keep_every,
            ),
            detector=SpikeDetector(cfg.stability),
        )
        if self.resume and run.checkpoints.latest_step() is not None:
            extra = self._load_state(run.checkpoints, module, run.optimizers)
            run.state = StageState(extra["step"] + 1, extra["skip"], extra["stability"])
            run.detector.load_state_dict(extra["stability"])
            restore_rng_state(extra["rng"])
            log.info("resumed stage %s at step %d", stage.name, run.state.step)
        else:
            warm_start(cfg, i, module, env.distributed)
        if stage.irepa.steps > run.state.step:
            from krea2.trainer.irepa import build_encoder

            factor = self.ae.spatial_factor * module.dit.cfg.patch
            run.encoder = build_encoder(
                stage.irepa.encoder, stage.irepa.encoder_dim, factor, cfg.seed
            ).to(env.device)
            module.set_irepa(stage.irepa.layer)
        return run

    def _save(self, run: StageRun, step: int, sync: bool) -> None:
        """Checkpoint ``step`` with the loop state; async unless ``sync`` (a stage's end)."""
        extra = {
            "step": step,
            "skip": run.state.skip,
            "stability": run.detector.state_dict(),
            "rng": capture_rng_state(),
            "data": {"stage": run.stage.name, "step": step, "batches_per_epoch": len(run.data)},
        }
        state = self._state(run.module, run.optimizers)
        if sync or not self.cfg.checkpoint.async_save:
            run.checkpoints.save(step, state, extra)
        else:
            run.checkpoints.async_save(step, state, extra)

    # ------------------------------------------------------------------ one step
    def _train_step(self, run: StageRun, batch: dict, step: int) -> tuple[dict, int | None]:
        """Forward and backward, then the update unless the spike guard drops it. Returns
        the step's metrics and, after a rollback, the step to restart from."""
        stage = run.stage
        if run.encoder is not None and step >= stage.irepa.steps:
            run.module.set_irepa(None)  # iREPA off for the rest of the stage
            run.encoder = None
        out = self._forward_backward(run, batch, step)
        verdict = run.detector.judge(out["loss"], out["grad_norm"])
        if not verdict.ok and self.cfg.stability.action is not SpikeAction.LOG:
            return out, self._spike_guard(run, verdict, out, batch["keys"], step)
        for opt in run.optimizers:
            opt.step()
        for opt in run.optimizers:
            opt.zero_grad(set_to_none=True)
        fp8 = stage.float8 is Float8Recipe.TENSORWISE and not stage.float8_emulate
        if fp8 and self.env.distributed:
            # float8 FSDP all-gathers need the new weights' scales: once for all blocks
            from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

            precompute_float8_dynamic_scale_for_fsdp(run.module.dit)
        return out, None

    def _spike_guard(
        self, run: StageRun, verdict: Verdict, out: dict, keys: list[str], step: int
    ) -> int | None:
        """Drop a bad step's update: count and log it with its batch keys, and stop the run
        after too many in a row; under ``rollback``, reload the newest checkpoint and mark
        the batch to be skipped. Returns the step to restart from after a rollback."""
        stability = self.cfg.stability
        self.metrics.skipped.labels(stage=run.stage.name, reason=verdict.reason).inc()
        log.warning(
            "step %d: %s (loss %.4g, grad norm %.4g); batch keys %s",
            step,
            verdict.reason,
            out["loss"],
            out["grad_norm"],
            keys[:8],
        )
        if run.detector.consecutive_bad > stability.max_bad_steps:
            raise TrainingStopped(
                f"stage {run.stage.name!r}: {run.detector.consecutive_bad} bad steps in a row "
                f"(last: {verdict.reason} at step {step}); lower the learning rate "
                "or inspect the batches logged above"
            )
        for opt in run.optimizers:
            opt.zero_grad(set_to_none=True)
        if stability.action is not SpikeAction.ROLLBACK or run.checkpoints.latest_step() is None:
            return None
        run.state.skip.append(step)
        extra = self._load_state(run.checkpoints, run.module, run.optimizers)
        run.detector.load_state_dict(extra["stability"])
        log.warning("rolled back to step %d; batch %d will be skipped", extra["step"], step)
        return extra["step"] + 1

    def _forward_backward(self, run: StageRun, batch: dict, step: int) -> dict[str, Any]:
        """The loss of ``batch``, backpropagated, its grads summed and clipped; returns the
        step's metrics, all-reduced over the dp ranks."""
        stage, module = run.stage, run.module
        cfg, env = self.cfg, self.env
        local = batch["pixels"].shape[0]
        weight = batch["weight"].to(env.device)
        bad = float((weight == 0).sum())
        if bad:
            self.metrics.bad_samples.labels(stage=stage.name).inc(bad)
        if bad / max(local, 1) > cfg.stability.max_bad_samples:
            raise TrainingStopped(
                f"step {step}: {int(bad)} of {local} samples could not be decoded "
                f"(over stability.max_bad_samples={cfg.stability.max_bad_samples}); "
                "check the shards named in the log"
            )
        lr = set_lr(run.optimizers, wsd_factor(step, stage.steps, stage.schedule))
        first = env.dp_rank * local
        gens = [sample_generator(cfg.seed, step, first + j) for j in range(local)]
        captions = choose_captions(
            batch["captions"], stage.caption_weights, stage.caption_dropout, gens
        )
        pixels = to_unit(batch["pixels"]).to(env.device)
        with torch.no_grad():
            latents = self.latents.encode(batch["keys"], pixels, self.ae.encode)
        latents = latents.to(next(module.dit.parameters()).dtype)
        patch = module.dit.cfg.patch
        tokens = (latents.shape[2] // patch) * (latents.shape[3] // patch)
        mu = stage_mu(stage.time_shift, tokens)
        t, noise = draw_time_and_noise(
            gens, tuple(latents.shape[1:]), mu, stage.time_loc, stage.time_scale
        )
        target = None
        if run.encoder is not None:
            grid = (latents.shape[2] // patch, latents.shape[3] // patch)
            target = run.encoder(pixels, grid)
        aux_box: list = []

        def velocity(x, _txt, tt, _mask):
            v, aux = module(x, tt, captions, target)
            aux_box.append(aux)
            return v

        terms = flow_terms(velocity, latents, None, None, t, noise)
        total_w = all_reduce_sum(weight.sum().detach().double().clone(), env)
        loss = weighted_loss(terms.per_sample, weight, total_w.to(weight.dtype), env.dp)
        irepa_loss = aux_box[0] if aux_box and aux_box[0] is not None else None
        if irepa_loss is not None:
            loss = loss + stage.irepa.weight * irepa_loss
        loss.backward()
        if env.tp > 1:
            sum_tp_partial_grads(run.tp_partial, env.mesh["tp"])
        grad_norm = clip_grad_norm(run.params, cfg.optimizer.grad_clip)
        stats = time_bucket_sums(terms.per_sample, terms.t, weight)
        flow_sum = torch.stack([(terms.per_sample.detach() * weight).sum().double()])
        packed = torch.cat([flow_sum, stats.flatten()])
        if irepa_loss is not None:
            packed = torch.cat([packed, irepa_loss.detach().double().view(1) / env.dp])
        all_reduce_sum(packed, env)
        flow_loss = float(packed[0] / total_w.clamp_min(1e-12))
        stats = packed[1 : 1 + 2 * TIME_BUCKETS].view(2, TIME_BUCKETS)
        out: dict[str, Any] = {
            "loss": flow_loss,
            "grad_norm": grad_norm,
            "lr": lr,
            "mu": mu,
            "image_tokens": tokens,
            "bad_samples": bad,
        }
        for b in range(TIME_BUCKETS):
            n = float(stats[1, b])
            out[f"loss_t{b}"] = float(stats[0, b]) / n if n else None
        if irepa_loss is not None:
            out["irepa_loss"] = float(packed[-1])
        return out
