"""The training loop: stages in order, each resumable to the exact step."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch

from krea2.dit.parallel import tp_partial_params
from krea2.infra.checkpoint import (
    CheckpointCorruptError,
    CheckpointManager,
    capture_rng_state,
    restore_rng_state,
)
from krea2.infra.checkpoint_layout import scan_checkpoints
from krea2.infra.errors import UserError
from krea2.infra.logging import get_logger
from krea2.infra.progress import Progress, progress
from krea2.infra.rank_health import RankHealth
from krea2.trainer.build import build_autoencoder, build_module, check_bucket, dit_config
from krea2.trainer.cache import latent_cache
from krea2.trainer.config import Float8Recipe, JobConfig, SpikeAction, StageConfig
from krea2.trainer.data import ShardIndex, batch_loader
from krea2.trainer.distributed import DistEnv, init_distributed
from krea2.trainer.ema import WeightEma
from krea2.trainer.lora import is_objective_adapter_key
from krea2.trainer.objectives import build_objective, judges_spikes, objective_adapters
from krea2.trainer.observe import MetricsLog, open_run_tracker
from krea2.trainer.optim import build_optimizers
from krea2.trainer.reporting import StageReports
from krea2.trainer.run_state import checkpoint_state, load_checkpoint_state
from krea2.trainer.stability import SpikeDetector, Verdict
from krea2.trainer.stage_status import stages_to_run
from krea2.trainer.step import (
    Objective,
    StageRun,
    StageState,
    TrainingStopped,
    forward_backward,
)
from krea2.trainer.style_export import write_stage_products
from krea2.trainer.validate import resolve_files
from krea2.trainer.warmstart import stage_checkpoints, warm_start

log = get_logger("trainer")
__all__ = ["StageRun", "StageState", "Trainer", "TrainingStopped"]


class Trainer:
    """Runs a :class:`JobConfig`: every stage, with checkpoints, guards and metrics.

    ``resume=True`` continues from the newest checkpoint of the first unfinished stage
    (model, optimizer, step, data position, RNG and guard state); otherwise an existing
    run directory with checkpoints is refused, so nothing is overwritten by accident.
    ``extend`` (with ``resume``) continues a finished stage whose config asks for more
    steps (:mod:`krea2.trainer.stage_status`).
    Each stage trains with the objective it names (``stage.objective``, built from its
    ``settings`` by :mod:`krea2.trainer.objectives`); an ``objective`` given here replaces
    every stage's instead (a caller holding in-process rewards or evaluation hooks).
    """

    def __init__(
        self,
        cfg: JobConfig,
        resume: bool = False,
        objective: Objective | None = None,
        extend: bool = False,
    ) -> None:
        self.cfg = cfg
        self.resume, self.extend = resume, extend
        self.objective = objective
        self.env: DistEnv = init_distributed(cfg)
        if cfg.parallel.deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS needs it
            torch.use_deterministic_algorithms(True)
        if cfg.parallel.threads:
            torch.set_num_threads(cfg.parallel.threads)
        self.run_dir = Path(cfg.run_dir)
        self.metrics = MetricsLog(
            self.run_dir / "metrics.jsonl",
            write=self.env.is_main,
            tracker=open_run_tracker(cfg, self.run_dir) if self.env.is_main else None,
        )
        self.ae = build_autoencoder(cfg.model, self.env.device)
        self.latents = latent_cache(cfg.data, self.ae)
        self.reports = StageReports(cfg, self.env, self.metrics, self.ae, self.run_dir)
        self._exporter = None
        # straggler scores; when launched, a hang bundle and GPU telemetry (krea2.infra)
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if cfg.observe.prometheus_port is not None:
            from krea2.infra.metrics import start_exporter

            # by local rank: every pod of a multi-node run serves the same ports
            self._exporter = start_exporter(cfg.observe.prometheus_port + local_rank)
        self.health = RankHealth(self.env.rank, self.env.world, local_rank, cfg.parallel.timeout_s)

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
        todo = stages_to_run(self.run_dir, self.cfg.stages, self.extend and self.resume)
        # Index every remaining stage's shards first: a broken shard or a bucket the model
        # cannot patchify fails now, not hours later when its stage begins.
        indexes = {i: self._indexes(i, s) for i, s in todo}
        for i, stage in todo:
            self.run_stage(i, stage, *indexes[i])
        self.health.close()
        if self._exporter is not None:
            self._exporter.close()
        self.metrics.close()

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
        """Train ``stage`` from its newest checkpoint (or its start) to its last step, then
        mark it finished. Ctrl-C lets a checkpoint in flight finish, says where a resume
        will continue, and re-raises: the stage is not marked finished."""
        run = self._resume_or_init(i, stage, index)
        bar = progress(
            f"train {stage.name}",
            stage.steps,
            unit="step",
            completed=run.state.step,
            enabled=self.env.is_main,
        )
        try:
            with bar:
                last_saved = self._train_steps(run, eval_index, bar)
        except KeyboardInterrupt:
            self._interrupted(run)
            raise
        run.checkpoints.wait()
        if last_saved != stage.steps - 1:
            if run.ema is not None:  # the stage's result is its average (ema_decay)
                run.ema.copy_to_params()
            self._save(run, stage.steps - 1, sync=True)
        self.reports.finish(stage, run.module, eval_index)
        final = run.checkpoints.path_of(stage.steps - 1)
        for path in write_stage_products(self.cfg, i, run.module, final, self.env.is_main):
            log.info("stage %s: %s written", stage.name, path)
        if self.env.is_main:
            self._done_marker(stage).write_text(f"{stage.steps}\n")
        if self.env.distributed:
            torch.distributed.barrier()

    def _train_steps(self, run: StageRun, eval_index: ShardIndex | None, bar: Progress) -> int:
        """The stage's remaining steps (restarting the loader after a rollback); returns
        the last step checkpointed on the way."""
        cfg, env, stage = self.cfg, self.env, run.stage
        step = run.state.step
        last_saved = step - 1
        while step < stage.steps:  # a rollback starts the loader again at the restored step
            loader = batch_loader(
                run.data,
                env.dp_rank,
                env.dp,
                step,
                stage.steps,
                cfg.data.workers,
                cfg.data.prefetch,
            )
            restart = None
            t_prev, cpu_prev = time.perf_counter(), time.process_time()
            for batch in loader:
                waited = time.perf_counter() - t_prev  # local: before any collective
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
                self.health.step(step, waited, {"loss": out["loss"], "step_time": out["step_time"]})
                self.reports.step(stage, run.module.dit.cfg, step, out)
                bar.update(step + 1, loss=f"{out['loss']:.4f}")
                every = cfg.checkpoint.every
                if every and (step + 1) % every == 0 and step + 1 < stage.steps:
                    self._save(run, step, sync=False)
                    last_saved = step
                self.reports.periodic(stage, step, run.module, eval_index)
                step += 1
            if restart is None:
                break
        return last_saved

    def _interrupted(self, run: StageRun) -> None:
        """After Ctrl-C: finish the checkpoint in flight (never leave it torn) and log
        where ``--resume`` will continue."""
        try:
            run.checkpoints.wait()
        except Exception as exc:  # the save failed; the older checkpoints stand
            log.warning("the checkpoint in flight failed: %s", exc)
        newest = run.checkpoints.latest_step()
        where = "its beginning" if newest is None else f"step {newest + 1}"
        log.warning(
            "interrupted: stage %s is not finished; krea2 train --resume continues it from %s",
            run.stage.name,
            where,
        )

    def _resume_or_init(self, i: int, stage: StageConfig, index: ShardIndex) -> StageRun:
        """Build the stage's module and optimizers, then resume them (with the step, guard
        and RNG state) from the stage's newest checkpoint, or start from earlier weights."""
        cfg, env = self.cfg, self.env
        module = build_module(cfg, stage, env, objective_adapters(stage))
        lr = stage.lr if stage.lr is not None else cfg.optimizer.lr
        trainable = [(n, p) for n, p in module.named_parameters()
                     if p.requires_grad and not is_objective_adapter_key(n)]  # fmt: skip
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
                keep_offset=1,  # step s holds s + 1 steps: keep_every=200 keeps 199, 399, ...
            ),
            detector=SpikeDetector(cfg.stability, spikes=judges_spikes(stage)),
            objective=self.objective if self.objective is not None else build_objective(stage, cfg),
        )
        frozen_base = stage.lora.enabled or module.style is not None
        if frozen_base:  # the frozen base, which checkpoints do not hold
            warm_start(cfg, i, module, env.distributed)
        if stage.ema_decay > 0:  # a template a resume loads in place; else reset below
            run.ema = WeightEma(run.params)
        extra = self._resume_from_checkpoint(run) if self.resume else None
        if extra is not None:
            run.state = StageState(extra["step"] + 1, extra["skip"], extra["stability"])
            run.detector.load_state_dict(extra["stability"])
            restore_rng_state(extra["rng"])
            log.info("resumed stage %s at step %d", stage.name, run.state.step)
        else:
            if not frozen_base:
                warm_start(cfg, i, module, env.distributed)
            if run.ema is not None:  # the average starts at the stage's starting weights
                run.ema.update(0.0)
        if stage.irepa.steps > run.state.step:
            from krea2.trainer.irepa import build_encoder

            factor = self.ae.spatial_factor * module.dit.cfg.patch
            run.encoder = build_encoder(
                stage.irepa.encoder, stage.irepa.encoder_dim, factor, cfg.seed
            ).to(env.device)
            module.set_irepa(stage.irepa.layer)
        if run.objective is not None and run.objective.needs_reference:
            run.reference = build_module(cfg, stage, env)
            warm_start(cfg, i, run.reference, env.distributed)
            run.reference.requires_grad_(False)
        return run

    def _resume_from_checkpoint(self, run: StageRun) -> dict[str, Any] | None:
        """Load the stage's newest loadable checkpoint into ``run``; returns its plain data,
        or None when the stage has none. A corrupt newer one is reported and set aside by
        the manager; when none loads, the run stops (the module may be half-loaded)."""
        if not scan_checkpoints(run.checkpoints.root):  # (torn or corrupt ones count)
            # No template either: torch's get_optimizer_state_dict initialises an empty
            # AdamW with a zero step, which would leave a fresh stage's step count at 1.
            return None
        try:
            return load_checkpoint_state(run, run.objective)
        except FileNotFoundError:
            return None
        except CheckpointCorruptError as exc:
            raise UserError(
                f"stage {run.stage.name!r}: no checkpoint under {run.checkpoints.root} loads "
                f"(newest: {exc.problem}); each is kept as corrupt-step-* for inspection. "
                "Run the same command again to restart the stage from its beginning"
            ) from exc

    def _save(self, run: StageRun, step: int, sync: bool) -> None:
        """Checkpoint ``step`` with the loop state; async unless ``sync`` (a stage's end)."""
        extra = {
            "step": step,
            "skip": run.state.skip,
            "stability": run.detector.state_dict(),
            "rng": capture_rng_state(),
            "data": {"stage": run.stage.name, "step": step, "batches_per_epoch": len(run.data)},
        }
        state = checkpoint_state(run, run.objective)
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
        if run.ema is not None:
            run.ema.update(stage.ema_decay)
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
        extra = load_checkpoint_state(run, run.objective)
        run.detector.load_state_dict(extra["stability"])
        log.warning("rolled back to step %d; batch %d will be skipped", extra["step"], step)
        return extra["step"] + 1

    def _forward_backward(self, run: StageRun, batch: dict, step: int) -> dict[str, Any]:
        """One batch's loss, backpropagated (see :func:`krea2.trainer.step.forward_backward`),
        or the stage's own objective's."""
        step_fn = run.objective or forward_backward
        return step_fn(
            run,
            batch,
            step,
            self.cfg,
            self.env,
            lambda keys, pixels: self.latents.encode(keys, pixels, self.ae.encode),
            self.metrics.bad_samples,
        )
