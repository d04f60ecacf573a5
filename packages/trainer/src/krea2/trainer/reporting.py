"""What the training loop reports besides its loss: per-step throughput and MFU, held-out
loss and sample grids, as metrics rows and log lines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from krea2.infra.logging import get_logger
from krea2.trainer.build import TrainModule
from krea2.trainer.config import CheckpointingMode, JobConfig, StageConfig
from krea2.trainer.data import ShardIndex
from krea2.trainer.distributed import DistEnv
from krea2.trainer.evaluate import eval_loss, sample_grid, save_grid
from krea2.trainer.objective import stage_mu
from krea2.trainer.observe import MetricsLog, mfu

log = get_logger("trainer")


class StageReports:
    """The reports of one job's stages (only rank 0 writes files; every rank computes)."""

    def __init__(
        self, cfg: JobConfig, env: DistEnv, metrics: MetricsLog, ae: Any, run_dir: Path
    ) -> None:
        self.cfg = cfg
        self.env = env
        self.metrics = metrics
        self.ae = ae  # the job's frozen autoencoder
        self.run_dir = run_dir

    def step(self, stage: StageConfig, dcfg, step: int, out: dict[str, Any]) -> None:
        """Add throughput and MFU to a step's metrics ``out``; record and log every
        ``observe.log_every`` steps and at the stage's last step."""
        from krea2.dit.flops import cost

        cfg, env = self.cfg, self.env
        global_batch = stage.batch_size
        dt = out["step_time"]
        out["samples_per_second"] = global_batch / dt
        out["tokens_per_second"] = global_batch * out["image_tokens"] / dt
        mode = None if stage.checkpointing is CheckpointingMode.NONE else stage.checkpointing.value
        flops = cost(
            dcfg, global_batch, out["image_tokens"], cfg.text.max_tokens, checkpointing=mode
        ).train_flops
        out["mfu"] = mfu(flops, dt, env.world, cfg.observe.peak_tflops)
        out["step"] = step
        if step % cfg.observe.log_every == 0 or step == stage.steps - 1:
            self.metrics.record("train", stage.name, out)
            log.info(
                "%s step %d loss %.4f grad %.3f lr %.2e %.1f samples/s",
                stage.name,
                step,
                out["loss"],
                out["grad_norm"],
                out["lr"],
                out["samples_per_second"],
            )

    def periodic(
        self, stage: StageConfig, step: int, module: TrainModule, eval_index: ShardIndex | None
    ) -> None:
        """Held-out loss and samples every ``eval_every`` / ``sample_every`` steps."""
        obs = self.cfg.observe
        last = step == stage.steps - 1
        if obs.eval_every and (step + 1) % obs.eval_every == 0 and not last:
            self._eval(stage, step, module, eval_index)
        if obs.sample_every and (step + 1) % obs.sample_every == 0 and not last:
            self._samples(stage, step, module)

    def finish(
        self, stage: StageConfig, module: TrainModule, eval_index: ShardIndex | None
    ) -> None:
        """Held-out loss and samples of the stage's final weights."""
        self._eval(stage, stage.steps - 1, module, eval_index)
        self._samples(stage, stage.steps - 1, module)

    def _eval(
        self, stage: StageConfig, step: int, module: TrainModule, eval_index: ShardIndex | None
    ) -> None:
        if eval_index is None:
            return
        obs = self.cfg.observe
        value = eval_loss(
            module,
            self.ae,
            eval_index,
            self.env,
            obs.eval_batches,
            obs.eval_times,
            self.cfg.seed,
            stage.caption_weights,
        )
        self.metrics.record("eval", stage.name, {"step": step, "eval_loss": value})
        log.info("%s step %d eval loss %.4f", stage.name, step, value)

    def _samples(self, stage: StageConfig, step: int, module: TrainModule) -> None:
        obs = self.cfg.observe
        if not obs.sample_prompts:
            return
        size = (stage.resolution, stage.resolution)
        f = self.ae.spatial_factor * module.dit.cfg.patch
        mu = stage_mu(stage.time_shift, (size[0] // f) * (size[1] // f))
        images = sample_grid(
            module,
            self.ae,
            obs.sample_prompts,
            obs.sample_seeds,
            size,
            obs.sample_steps,
            obs.sample_cfg,
            mu,
        )
        if self.env.is_main:
            path = self.run_dir / "samples" / f"{stage.name}-{step:06d}.png"
            save_grid(images, obs.sample_prompts, path)
            self.metrics.record("samples", stage.name, {"step": step, "path": str(path)})
        if obs.second_base and stage.lora.enabled:
            self._second_base_samples(stage, step, module, size)

    def _second_base_samples(
        self, stage: StageConfig, step: int, module: TrainModule, size: tuple[int, int]
    ) -> None:
        """The grid with the stage's adapter on ``observe.second_base``: the frozen base is
        swapped in place (sharded, like training loads it), sampled, and the training base
        loaded back from the same file, so training continues bit for bit."""
        from krea2.dit.release import read_time_shift
        from krea2.trainer.release_init import load_release_weights, release_source
        from krea2.trainer.warmstart import warm_start

        obs, env = self.cfg.observe, self.env
        index = [s.name for s in self.cfg.stages].index(stage.name)
        source = release_source(obs.second_base)
        f = self.ae.spatial_factor * module.dit.cfg.patch
        tokens = (size[0] // f) * (size[1] // f)
        root = Path(obs.second_base)
        shift = read_time_shift(root) if root.is_dir() else None
        mu = shift.mu(tokens) if shift is not None else stage_mu(stage.time_shift, tokens)
        load_release_weights(module, source, env.distributed, "observe.second_base")
        try:
            images = sample_grid(
                module,
                self.ae,
                obs.sample_prompts,
                obs.sample_seeds,
                size,
                obs.second_base_steps,
                obs.second_base_cfg,
                mu,
            )
        finally:
            warm_start(self.cfg, index, module, env.distributed)
        if env.is_main:
            path = self.run_dir / "samples" / f"{stage.name}-{step:06d}-second-base.png"
            save_grid(images, obs.sample_prompts, path)
            row = {"step": step, "path": str(path), "name": "second_base"}
            self.metrics.record("samples_second_base", stage.name, row)
