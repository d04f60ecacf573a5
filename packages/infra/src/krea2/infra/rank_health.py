"""One training rank's health guards behind the three calls a loop makes.

:class:`RankHealth` bundles the straggler detector (every rank, one all-gather per
window), the hang watchdog (when launched: ``KREA2_HANG_DIR``) and the rank's GPU
telemetry (when launched: ``KREA2_TELEMETRY_INTERVAL_S``), so a training loop creates it
once, calls :meth:`RankHealth.step` after each step and :meth:`RankHealth.close` at the
end.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from krea2.infra.stragglers import StragglerDetector, StragglerReport
from krea2.infra.telemetry import start_rank_telemetry
from krea2.infra.watchdog import HangWatchdog


class RankHealth:
    """Stragglers, hang watchdog and GPU telemetry of one rank (times in seconds)."""

    def __init__(
        self,
        rank: int,
        world: int,
        local_rank: int,
        collective_timeout_s: float,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.stragglers = StragglerDetector(rank=rank, world=world)
        self.watchdog = HangWatchdog.from_env(collective_timeout_s, rank, env)
        if self.watchdog is not None:
            self.watchdog.start()
        self.telemetry = start_rank_telemetry(local_rank, None if env is None else dict(env))

    def step(self, step: int, local_s: float, metrics: dict[str, Any]) -> StragglerReport | None:
        """After each finished step (on every rank: the straggler verdict is a collective).

        ``local_s`` is this rank's share of the step that the collectives do not equalise
        (in the trainer: the wait for its batch); ``metrics`` go into a hang bundle.
        """
        report = self.stragglers.record(local_s)
        if self.watchdog is not None:
            self.watchdog.beat(step, metrics)
        return report

    def close(self) -> None:
        """A normal end: disarm the watchdog and stop the telemetry thread."""
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.telemetry is not None:
            self.telemetry.stop()
