"""Per-rank step times and slow-rank (straggler) detection across a distributed job.

Every rank times its own share of a step (the work before it blocks on a collective:
a synchronous job's wall step time is the same on every rank, so only the local part
shows who is slow). Every ``window`` steps the ranks exchange their window medians in
one small all-gather and each gets the same verdict, with two scores per rank in (0, 1]:

* relative: the job's median over this rank's time. One rank far slower than its peers
  (a hot GPU, a bad link, a noisy neighbour) scores low while the others score 1.
* absolute: a reference time over this rank's time. The reference is
  ``expected_step_s`` when configured, else the best window median the job has seen;
  it catches the whole job slowing down together, which relative scores cannot see.

A rank is flagged when either score falls below its threshold. torch is imported only
when the process group is initialised (the ``torch`` extra).
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import krea2.infra.metrics as m
from krea2.infra.logging import get_logger

log = get_logger("infra.stragglers")


@dataclass
class StragglerConfig:
    """When to judge and what counts as slow. Times in seconds."""

    window: int = 20  # steps per judgement (one all-gather of one float per rank)
    relative_threshold: float = 0.8  # flag below: 25% slower than the job's median
    absolute_threshold: float = 0.7  # flag below: 43% slower than the reference time
    expected_step_s: float | None = None  # reference for absolute scores; None: best seen
    # A rank faster than this is never flagged: a few ms of loader jitter is not a straggler.
    min_flag_s: float = 0.05

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"window={self.window} must be at least 1 step")
        for name in ("relative_threshold", "absolute_threshold"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ValueError(f"{name}={getattr(self, name)} must be in (0, 1]")


@dataclass(frozen=True)
class RankScore:
    rank: int
    seconds: float  # median local step time over the window
    relative: float  # job median / this rank's time, capped at 1
    absolute: float  # reference / this rank's time, capped at 1
    flagged: bool


@dataclass
class StragglerReport:
    """One window's verdict, identical on every rank."""

    step: int
    scores: list[RankScore]
    reference_s: float
    stragglers: list[int] = field(default_factory=list)

    def __str__(self) -> str:
        if not self.stragglers:
            return f"step {self.step}: no straggler among {len(self.scores)} ranks"
        slow = "; ".join(
            f"rank {s.rank} {s.seconds * 1e3:.1f} ms (relative {s.relative:.2f}, "
            f"absolute {s.absolute:.2f})"
            for s in self.scores
            if s.flagged
        )
        return f"step {self.step}: stragglers {slow}"


def score_ranks(
    times: Sequence[float], reference_s: float, cfg: StragglerConfig
) -> list[RankScore]:
    """Scores for per-rank median times (seconds), given the absolute reference time."""
    median = statistics.median(times)
    scores = []
    for rank, t in enumerate(times):
        t = max(t, 1e-9)
        relative = min(1.0, median / t)
        absolute = min(1.0, reference_s / t)
        slow = relative < cfg.relative_threshold or absolute < cfg.absolute_threshold
        flagged = slow and t >= cfg.min_flag_s
        scores.append(RankScore(rank, t, relative, absolute, flagged))
    return scores


def _gather(value: float, world: int, group: Any) -> list[float]:
    """Every rank's ``value`` (one all-gather); ``[value]`` without a process group."""
    if world == 1:
        return [value]
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        return [value]
    device = torch.device("cpu")
    if dist.get_backend(group) == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    mine = torch.tensor([value], dtype=torch.float64, device=device)
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine, group=group)
    return [float(t.item()) for t in every]


class StragglerDetector:
    """Times this rank's steps and judges every rank each ``window`` steps.

    Use :meth:`measure` around the rank's local work, or pass a time to :meth:`record`;
    every rank must make the same number of calls (the judgement is a collective).
    """

    def __init__(
        self,
        cfg: StragglerConfig | None = None,
        rank: int = 0,
        world: int = 1,
        group: Any = None,
    ) -> None:
        self.cfg = cfg or StragglerConfig()
        self.rank, self.world, self.group = rank, world, group
        self._times: deque[float] = deque(maxlen=self.cfg.window)
        self._steps = 0
        self._best: float | None = None
        self.last: StragglerReport | None = None
        labels = ("rank",)
        self._step_s = m.gauge(
            "infra",
            "rank_local_seconds",
            "Median local (non-collective) time per step and rank (s).",
            labels,
            "max",
        )
        self._relative = m.gauge(
            "infra", "straggler_relative_score", "Job median / rank step time.", labels, "max"
        )
        self._absolute = m.gauge(
            "infra", "straggler_absolute_score", "Reference / rank step time.", labels, "max"
        )
        self._flagged = m.counter(
            "infra", "straggler_windows_total", "Windows in which a rank was flagged.", labels
        )

    @contextmanager
    def measure(self) -> Iterator[None]:
        """Time the block as this rank's local step work."""
        start = time.perf_counter()
        yield
        self.record(time.perf_counter() - start)

    def record(self, seconds: float) -> StragglerReport | None:
        """Add one step's local time; at the end of a window, the job's verdict."""
        self._times.append(seconds)
        self._steps += 1
        if self._steps % self.cfg.window:
            return None
        return self.judge()

    def judge(self) -> StragglerReport:
        """Exchange window medians with every rank and score them (a collective)."""
        mine = statistics.median(self._times) if self._times else 0.0
        times = _gather(mine, self.world, self.group)
        job_median = statistics.median(times)
        self._best = job_median if self._best is None else min(self._best, job_median)
        reference = self.cfg.expected_step_s or self._best
        scores = score_ranks(times, reference, self.cfg)
        report = StragglerReport(self._steps, scores, reference)
        report.stragglers = [s.rank for s in scores if s.flagged]
        for s in scores:  # every rank exports every score; Prometheus takes max per rank
            label = str(s.rank)
            self._step_s.labels(label).set(s.seconds)
            self._relative.labels(label).set(s.relative)
            self._absolute.labels(label).set(s.absolute)
        if self.rank in report.stragglers:
            self._flagged.labels(str(self.rank)).inc()
        if report.stragglers and self.rank == 0:  # one line per verdict, not one per rank
            log.warning("%s", report)
        self.last = report
        return report
