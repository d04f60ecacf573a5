"""The fake score: a second DiT that learns the student's distribution, with its own AdamW.

Built like the stage's module (the trainer's ``build_module``: the same dtype, TP, FSDP
units), so at scale it is sharded like the student and its gradients are averaged over the
dp ranks by FSDP. ``copy``: the whole DiT trains (its text conditioner stays frozen at
the teacher's); ``lora``: peft adapters (the trainer's LoRA code) on a frozen copy of the
teacher, so only the adapters and their moments are trained and checkpointed;
``adapter``: a second adapter (``FAKE_ADAPTER``) on a LoRA student's own module, which the
trainer built in before sharding (the objective's ``adapters``): no second DiT at all.

It starts equal to the teacher (the stage's frozen start, ``run.reference``, or the
student's base with its adapters off). Its trained tensors and AdamW moments are the
objective's checkpoint state (:meth:`state_dict`, loaded in place on a resume; an
``adapter``'s weights are in the stage's own checkpoint, beside the student's adapter);
the frozen part is copied from the teacher again in every process.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor, nn

from krea2.rl.distill.config import FakeScoreKind, TdmConfig

FAKE_ADAPTER = "fake"  # the peft adapter name of an ``adapter`` fake score


class FakeScore:
    """``module``: a ``TrainModule`` (velocity = module(x, t, captions)[0]; the student's
    own for an ``adapter``); ``named``: its trained parameters by name; ``optimizer``:
    AdamW over them, moments allocated at construction so a checkpoint can be loaded into
    them before the first step."""

    def __init__(self, module: nn.Module, kind: FakeScoreKind, lr: float, job: Any) -> None:
        self.module = module
        self.kind = kind
        shared = kind is FakeScoreKind.ADAPTER  # the student's module: only the fake adapter
        self.named = [(n, p) for n, p in module.named_parameters()
                      if p.requires_grad and (not shared or f".{FAKE_ADAPTER}." in n)]  # fmt: skip
        self.params = [p for _, p in self.named]
        opt = job.optimizer
        # foreach=False: under FSDP+TP the parameters live on two meshes (as the trainer's)
        self.optimizer = torch.optim.AdamW(
            self.params, lr=lr, betas=tuple(opt.betas), eps=opt.eps,
            weight_decay=opt.weight_decay, foreach=False,
        )  # fmt: skip
        for p in self.params:  # AdamW fills an empty state lazily; a resume needs it now
            self.optimizer.state[p] = {
                "step": torch.tensor(0.0, dtype=torch.float32),
                "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
            }
        self.grad_clip = opt.grad_clip
        self.tp_partial: list[nn.Parameter] = []

    @classmethod
    def build(
        cls,
        job: Any,
        stage: Any,
        env: Any,
        settings: TdmConfig,
        lr: float,
        student: nn.Module | None = None,
    ) -> FakeScore:
        """A fake score for ``stage`` of ``job`` on ``env``'s layout (random weights until
        :meth:`load_teacher` or a checkpoint fills them); an ``adapter`` one is the
        ``FAKE_ADAPTER`` of ``student``, the stage's module."""
        from krea2.trainer.build import build_module
        from krea2.trainer.config import LoraConfig

        if settings.fake is FakeScoreKind.ADAPTER:
            if student is None or not any(f".{FAKE_ADAPTER}." in n
                                          for n, _ in student.named_parameters()):  # fmt: skip
                raise ValueError("an adapter fake score needs the student built with it")
            module = student
        elif settings.fake is FakeScoreKind.LORA:
            module = build_module(
                job, replace(stage, lora=LoraConfig(settings.fake_lora_rank)), env
            )
        else:
            module = build_module(job, replace(stage, lora=LoraConfig()), env)
            module.requires_grad_(False)
            module.dit.requires_grad_(True)
        fake = cls(module, settings.fake, lr, job)
        if env.tp > 1:
            from krea2.dit.parallel import tp_partial_params

            mine = {id(p) for p in fake.params}
            fake.tp_partial = [p for p in tp_partial_params(module.dit) if id(p) in mine]
        return fake

    @torch.no_grad()
    def load_teacher(self, teacher: nn.Module, trained_too: bool) -> None:
        """Copy the teacher's weights into the frozen part (and with ``trained_too`` into
        the trained part, zeroing the AdamW moments: the stage's first step). LoRA's
        adapters are never copied: B = 0 at build, so the fake equals the teacher. An
        ``adapter`` fake shares the teacher's (its student's) base: only the moments."""
        from krea2.trainer.lora import is_adapter_key, released_name

        if self.kind is FakeScoreKind.ADAPTER:
            if trained_too:
                self._zero_moments()
            return
        source = dict(teacher.named_parameters())
        for name, p in self.module.named_parameters():
            if is_adapter_key(name) or (p.requires_grad and not trained_too):
                continue
            p.detach().copy_(source[released_name(name)].detach())
        if trained_too:
            self._zero_moments()

    def _zero_moments(self) -> None:
        for p in self.params:
            for value in self.optimizer.state[p].values():
                value.zero_()

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """The fake score in use within the block: for an ``adapter``, the student's module
        applies the fake adapter alone (keep the fake loss's backward inside the block, as
        activation checkpointing recomputes the forward there); else nothing to switch."""
        if self.kind is not FakeScoreKind.ADAPTER:
            yield
            return
        from krea2.trainer.lora import adapter_in_use

        with adapter_in_use(self.module.dit, FAKE_ADAPTER):
            yield

    def velocity(self, x: Tensor, t: Tensor, captions: list[str]) -> Tensor:
        """The fake score's velocity [B, C, H, W] at x [B, C, H, W], t [B]."""
        with self.active():
            return self.module(x, t.to(x.dtype), captions)[0]

    def step(self, env: Any) -> float:
        """After a backward of the fake loss: sum TP partial grads, clip to the job's
        ``optimizer.grad_clip``, take one AdamW step and clear the grads; returns the grad
        norm before clipping."""
        from krea2.trainer.optim import clip_grad_norm

        if env.tp > 1:
            from krea2.trainer.parallelize import sum_tp_partial_grads

            sum_tp_partial_grads(self.tp_partial, env.mesh["tp"])
        norm = clip_grad_norm(self.params, self.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def state_dict(self) -> dict[str, Tensor]:
        """The trained weights and their AdamW state by name (the tensors themselves, so a
        checkpoint load fills them in place; DTensor shards under FSDP); an ``adapter``'s
        weights are left to the stage's module checkpoint, which holds them."""
        out: dict[str, Tensor] = {}
        for name, p in self.named:
            state = self.optimizer.state[p]
            if self.kind is not FakeScoreKind.ADAPTER:  # (an adapter's: the stage's own)
                out[f"fake.{name}"] = p.detach()
            out[f"fake_exp_avg.{name}"] = state["exp_avg"]
            out[f"fake_exp_avg_sq.{name}"] = state["exp_avg_sq"]
            out[f"fake_step.{name}"] = state["step"]
        return out
