"""The training loop: stages in order, each resumable to the exact step."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

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
from krea2.trainer.evaluate import eval_loss, sample_grid, save_grid, to_unit
from krea2.trainer.objective import (
    TIME_BUCKETS,
    draw_time_and_noise,
    flow_terms,
    sample_generator,
    stage_mu,
    time_bucket_sums,
    weighted_loss,
)
from krea2.trainer.observe import MetricsLog, mfu
from krea2.trainer.optim import build_optimizers, clip_grad_norm, set_lr
from krea2.trainer.parallelize import sum_tp_partial_grads, tp_partial_params
from krea2.trainer.schedule import wsd_factor
from krea2.trainer.stability import SpikeDetector
from krea2.trainer.validate import resolve_files

log = get_logger("trainer")


class TrainingStopped(UserError):
    """The run stopped on purpose (too many bad steps or samples); the message says why."""


def _like(value: torch.Tensor, target) -> torch.Tensor:
    """``value`` (a full tensor) laid out as ``target``: sharded the same way if a DTensor."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(target, DTensor):
        return distribute_tensor(value.to(target.device), target.device_mesh, target.placements)
    return value.to(target.device)


@dataclass
class StageState:
    """Per-stage loop state that is saved with every checkpoint (as JSON ``extra``)."""

    step: int = 0  # next step to run
    skip: list[int] = field(default_factory=list)  # batches never to train on (rollbacks)
    stability: dict[str, Any] | None = None


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
        self.ae = build_autoencoder(cfg.model.autoencoder, cfg.model.ae_factor, self.env.device)
        self.latents = LatentCache(cfg.data.cache_latents)
        self._exporter = None
        if cfg.observe.prometheus_port is not None:
            from krea2.infra.metrics import start_exporter

            self._exporter = start_exporter(cfg.observe.prometheus_port + self.env.rank)

    # ------------------------------------------------------------------ paths
    def checkpoint_root(self, stage: StageConfig) -> Path:
        return self.run_dir / "checkpoints" / stage.name

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

    def _init_weights(self, i: int, stage: StageConfig, module: TrainModule) -> None:
        """Start from the previous stage's final weights (DiT and text; not the iREPA head)."""
        source: Path | None = None
        if stage.init_from == "previous" and i > 0:
            prev = self.cfg.stages[i - 1]
            source = self.checkpoint_root(prev)
        elif stage.init_from not in ("previous", "none") and Path(stage.init_from).is_dir():
            source = Path(stage.init_from)
        if source is None:
            return
        full = get_model_state_dict(module)
        wanted = {k: v for k, v in full.items() if not k.startswith("irepa.")}
        source_patch = self._source_patch(i, stage)
        patch = module.dit.cfg.patch
        channels = module.dit.cfg.latent_channels
        if source_patch != patch:  # load the source's shapes, then resize them to this stage's
            from krea2.dit.patch_resize import resize_patch_weights, shapes_at_patch

            for key, shape in shapes_at_patch(full, source_patch, channels, "dit.").items():
                wanted[key] = torch.empty(shape, dtype=full[key].dtype, device="cpu")
        if (source / ".metadata").exists():  # a single checkpoint directory
            import torch.distributed.checkpoint as dcp

            dcp.load({"model": wanted}, checkpoint_id=source, no_dist=not self.env.distributed)
        else:
            mgr = CheckpointManager(source)
            if mgr.latest_step() is None:
                raise UserError(
                    f"stage {stage.name!r} starts from {source}, which has no checkpoint"
                )
            mgr.load({"model": wanted})
        if source_patch != patch:
            resized = resize_patch_weights(wanted, source_patch, patch, channels, prefix="dit.")
            for key in shapes_at_patch(full, patch, channels, "dit."):
                wanted[key] = _like(resized[key], full[key])
            log.info(
                "stage %s: patch %d -> %d, pixel layers resized", stage.name, source_patch, patch
            )
        set_model_state_dict(module, wanted, options=StateDictOptions(strict=False))
        log.info("stage %s starts from %s", stage.name, source)

    def _source_patch(self, i: int, stage: StageConfig) -> int:
        """The patch of the weights this stage starts from: the previous stage's, else the
        model config's (a weights directory is assumed to be of the job's model)."""
        if stage.init_from == "previous" and i > 0:
            return dit_config(self.cfg, self.cfg.stages[i - 1]).patch
        return dit_config(self.cfg).patch

    def _indexes(self, i: int, stage: StageConfig) -> tuple[ShardIndex, ShardIndex | None]:
        index = ShardIndex(
            resolve_files(stage.data, f"stage {stage.name!r} data"),
            stage.batch_size,
            self.cfg.seed + 1000 * i,
            shuffle=stage.shuffle,
        )
        factor = self.cfg.model.ae_factor * dit_config(self.cfg, stage).patch
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
        cfg, env = self.cfg, self.env
        module = build_module(cfg, stage, env)
        factor = cfg.model.ae_factor * module.dit.cfg.patch
        lr = stage.lr if stage.lr is not None else cfg.optimizer.lr
        trainable = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        optimizers = build_optimizers(trainable, cfg.optimizer, lr)
        params = [p for _, p in trainable]
        self._tp_partial = tp_partial_params(module) if env.tp > 1 else []
        mgr = CheckpointManager(
            self.checkpoint_root(stage), cfg.checkpoint.keep_last, cfg.checkpoint.keep_every
        )
        st = StageState()
        detector = SpikeDetector(cfg.stability)
        if self.resume and mgr.latest_step() is not None:
            extra = self._load_state(mgr, module, optimizers)
            st = StageState(extra["step"] + 1, extra["skip"], extra["stability"])
            detector.load_state_dict(extra["stability"])
            restore_rng_state(extra["rng"])
            log.info("resumed stage %s at step %d", stage.name, st.step)
        else:
            self._init_weights(i, stage, module)
        encoder = None
        if stage.irepa.steps > st.step:
            from krea2.trainer.irepa import build_encoder

            encoder = build_encoder(
                stage.irepa.encoder, stage.irepa.encoder_dim, factor, cfg.seed
            ).to(env.device)
            module.set_irepa(stage.irepa.layer)

        def save(step: int, sync: bool) -> None:
            extra = {
                "step": step,
                "skip": st.skip,
                "stability": detector.state_dict(),
                "rng": capture_rng_state(),
                "data": {"stage": stage.name, "step": step, "batches_per_epoch": len(index)},
            }
            state = self._state(module, optimizers)
            if sync or not cfg.checkpoint.async_save:
                mgr.save(step, state, extra)
            else:
                mgr.async_save(step, state, extra)

        fp8_all_gather = (
            stage.float8 is Float8Recipe.TENSORWISE and env.distributed and not stage.float8_emulate
        )
        step = st.step
        last_saved = step - 1
        while step < stage.steps:
            loader = batch_loader(
                index, env.dp_rank, env.dp, step, stage.steps, cfg.data.workers, cfg.data.prefetch
            )
            rolled_back = False
            t_prev, cpu_prev = time.perf_counter(), time.process_time()
            for batch in loader:
                step = batch["step"]
                if step in st.skip:
                    log.warning("step %d: skipping batch marked bad by a rollback", step)
                    step += 1
                    continue
                if encoder is not None and step >= stage.irepa.steps:
                    module.set_irepa(None)  # iREPA off for the rest of the stage
                    encoder = None
                out = self._train_step(stage, module, optimizers, params, batch, step, encoder)
                verdict = detector.judge(out["loss"], out["grad_norm"])
                if not verdict.ok and cfg.stability.action is not SpikeAction.LOG:
                    self.metrics.skipped.labels(stage=stage.name, reason=verdict.reason).inc()
                    keys = batch["keys"]
                    log.warning(
                        "step %d: %s (loss %.4g, grad norm %.4g); batch keys %s",
                        step,
                        verdict.reason,
                        out["loss"],
                        out["grad_norm"],
                        keys[:8],
                    )
                    if detector.consecutive_bad > cfg.stability.max_bad_steps:
                        raise TrainingStopped(
                            f"stage {stage.name!r}: {detector.consecutive_bad} bad steps in a row "
                            f"(last: {verdict.reason} at step {step}); lower the learning rate "
                            "or inspect the batches logged above"
                        )
                    for opt in optimizers:
                        opt.zero_grad(set_to_none=True)
                    if (
                        cfg.stability.action is SpikeAction.ROLLBACK
                        and mgr.latest_step() is not None
                    ):
                        st.skip.append(step)
                        extra = self._load_state(mgr, module, optimizers)
                        detector.load_state_dict(extra["stability"])
                        step = extra["step"] + 1
                        log.warning(
                            "rolled back to step %d; batch %d will be skipped",
                            step - 1,
                            st.skip[-1],
                        )
                        rolled_back = True
                        break
                else:
                    for opt in optimizers:
                        opt.step()
                    for opt in optimizers:
                        opt.zero_grad(set_to_none=True)
                    if fp8_all_gather:
                        # float8 FSDP all-gathers need the new weights' scales, computed once
                        # for all blocks instead of per all-gather.
                        from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

                        precompute_float8_dynamic_scale_for_fsdp(module.dit)
                now, cpu_now = time.perf_counter(), time.process_time()
                out["step_time"] = now - t_prev  # wall seconds, data wait included
                out["step_cpu_time"] = cpu_now - cpu_prev  # this process's CPU seconds
                t_prev, cpu_prev = now, cpu_now
                self._log_step(stage, module.dit.cfg, step, out, batch)
                every = cfg.checkpoint.every
                if every and (step + 1) % every == 0 and step + 1 < stage.steps:
                    save(step, sync=False)
                    last_saved = step
                self._periodic(stage, step, module, eval_index)
                step += 1
            if not rolled_back:
                break
        mgr.wait()
        if last_saved != stage.steps - 1:
            save(stage.steps - 1, sync=True)
        self._finish(stage, module, eval_index)
        if env.is_main:
            self._done_marker(stage).write_text(f"{stage.steps}\n")
        if env.distributed:
            torch.distributed.barrier()

    # ------------------------------------------------------------------ one step
    def _train_step(self, stage, module, optimizers, params, batch, step, encoder) -> dict:
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
        lr = set_lr(optimizers, wsd_factor(step, stage.steps, stage.schedule))
        first = env.dp_rank * local
        gens = [sample_generator(cfg.seed, step, first + j) for j in range(local)]
        captions = choose_captions(
            batch["captions"], stage.caption_weights, stage.caption_dropout, gens
        )
        pixels = to_unit(batch["pixels"]).to(env.device)
        with torch.no_grad():
            latents = self.latents.encode(batch["keys"], pixels, self.ae.encode)
        dtype = next(module.dit.parameters()).dtype
        latents = latents.to(dtype)
        patch = module.dit.cfg.patch
        tokens = (latents.shape[2] // patch) * (latents.shape[3] // patch)
        mu = stage_mu(stage.time_shift, tokens)
        t, noise = draw_time_and_noise(
            gens, tuple(latents.shape[1:]), mu, stage.time_loc, stage.time_scale
        )
        target = None
        if encoder is not None:
            grid = (latents.shape[2] // patch, latents.shape[3] // patch)
            target = encoder(pixels, grid)
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
            sum_tp_partial_grads(self._tp_partial, env.mesh["tp"])
        grad_norm = clip_grad_norm(params, cfg.optimizer.grad_clip)
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

    # ------------------------------------------------------------------ observability
    def _log_step(self, stage: StageConfig, dcfg, step: int, out: dict, batch: dict) -> None:
        from krea2.dit.flops import cost

        cfg, env = self.cfg, self.env
        global_batch = stage.batch_size
        dt = out["step_time"]
        out["samples_per_second"] = global_batch / dt
        out["tokens_per_second"] = global_batch * out["image_tokens"] / dt
        mode = stage.checkpointing.value if stage.checkpointing.value != "none" else None
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

    def _periodic(self, stage, step, module, eval_index) -> None:
        obs = self.cfg.observe
        last = step == stage.steps - 1
        if obs.eval_every and (step + 1) % obs.eval_every == 0 and not last:
            self._eval(stage, step, module, eval_index)
        if obs.sample_every and (step + 1) % obs.sample_every == 0 and not last:
            self._samples(stage, step, module)

    def _finish(self, stage, module, eval_index) -> None:
        self._eval(stage, stage.steps - 1, module, eval_index)
        self._samples(stage, stage.steps - 1, module)

    def _eval(self, stage, step, module, eval_index) -> None:
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

    def _samples(self, stage, step, module) -> None:
        obs = self.cfg.observe
        if not obs.sample_prompts:
            return
        size = (stage.resolution, stage.resolution)
        f = self.cfg.model.ae_factor * module.dit.cfg.patch
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
