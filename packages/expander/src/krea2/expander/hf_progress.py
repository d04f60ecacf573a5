"""trl/transformers training loops reported like every krea2 loop (`krea2.infra.progress`):
one bar or periodic line per run with the last logged loss and rewards, instead of
transformers' printed dicts and the datasets/weights progress bars."""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from krea2.infra.progress import Progress, progress

__all__ = ["KreaProgress", "quiet_hf"]

# Logged values worth a glance in the progress line (trl's names).
SHOWN = ("loss", "reward", "rewards/faithfulness/mean", "rewards/rubric/mean",
         "rewards/diversity/mean")  # fmt: skip


def quiet_hf() -> None:
    """No progress bars from datasets (tokenizing) or transformers (weights, shards)."""
    import datasets
    from transformers.utils import logging

    datasets.disable_progress_bars()
    logging.disable_progress_bar()
    logging.set_verbosity_error()


class KreaProgress(TrainerCallback):
    """A `krea2.infra.progress` bar named ``name`` over a Trainer's ``max_steps``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.bar: Progress | None = None
        self.fields: dict[str, str] = {}

    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.bar = progress(self.name, total=state.max_steps, unit="step").__enter__()

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
        for key in SHOWN:
            if logs and isinstance(logs.get(key), int | float):
                self.fields[key.removeprefix("rewards/").removesuffix("/mean")] = f"{logs[key]:.3f}"

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.bar is not None:
            self.bar.update(state.global_step, **self.fields)

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None
