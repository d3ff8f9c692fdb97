"""The engine's clock against the wall clock: whose seconds the tuner's measurements are in.

vLLM runs in wall-clock time: a clock of speed-up 1, and nothing here changes its replays. The
simulated engine runs ``TUNER_SIM_SPEEDUP`` times faster than the H200 it models
(``tuner/sim/runtime.py``: a step the speed model says lasts ``d`` takes ``d / speedup`` of
wall time). :func:`tuner.measure.measure` replays through a :class:`Clock`, so that every time
and rate the tuner measures is the modelled GPU's, whatever the speed-up: a request's send time,
TTFT, ITL and end-to-end latency are multiplied by it on the way back (and with them TPOT,
throughput and SLO capacity, which are computed from those), an open loop's send times and the
replay's time limits are divided by it on the way out. The SLOs are then judged in the time of
the GPU the simulator models, as on that GPU, and a simulated capacity reads as that GPU's
(docs/sim-calibration.md, "The clock"); a higher speed-up only makes each replay shorter in wall
time. What the host itself costs (start-up, the replay client's lag, the simulator's own lag
behind its model) stays in wall-clock time.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from tuner.config import EngineConfig, TunerConfig
from tuner.errors import ConfigError
from tuner.records import RequestRecord, RequestSpec

__all__ = ["SPEEDUP_ENV", "Clock", "check"]

SPEEDUP_ENV = "TUNER_SIM_SPEEDUP"
"""The simulated engine's speed-up over the GPU it models (``tuner/sim/server.py`` reads it)."""


@dataclass(frozen=True)
class Clock:
    """How many times faster than the wall clock an engine's own time runs (1: vLLM)."""

    speedup: float = 1.0

    @classmethod
    def of(cls, engine: EngineConfig, environ: Mapping[str, str] | None = None) -> Clock:
        """The clock of ``engine``'s servers: the simulator's ``TUNER_SIM_SPEEDUP`` as its
        process gets it (``engine.env``, whose ``$NAME`` values are read from ours, over our own
        environment; unset: 1), 1 for vLLM. A value that is not a positive number is a
        :class:`ConfigError`."""
        if engine.kind != "sim":
            return cls()
        base = os.environ if environ is None else environ
        raw = engine.env.get(SPEEDUP_ENV)
        if raw is None:
            raw = base.get(SPEEDUP_ENV, "")
        elif raw.startswith("$"):
            raw = base.get(raw[1:], "")
        if not raw:
            return cls()
        try:
            speedup = float(raw)
        except ValueError:
            speedup = math.nan
        if not (math.isfinite(speedup) and speedup > 0):
            raise ConfigError(
                f"engine.env.{SPEEDUP_ENV} is {raw!r}; allowed: a number > 0 (how many times "
                "faster than the modelled GPU the simulator runs)"
            )
        return cls(speedup)

    def wall_s(self, seconds: float) -> float:
        """A duration of the engine's time in wall-clock seconds."""
        return seconds / self.speedup

    def wall_requests(self, specs: Sequence[RequestSpec]) -> list[RequestSpec]:
        """``specs`` with their open-loop send times in wall-clock seconds."""
        if self.speedup == 1.0:
            return list(specs)
        return [
            s if s.arrival_s is None else replace(s, arrival_s=s.arrival_s / self.speedup)
            for s in specs
        ]

    def modelled(self, r: RequestRecord) -> RequestRecord:
        """A record's times in the engine's own seconds."""
        k = self.speedup
        if k == 1.0:
            return r
        return replace(
            r,
            t_sent_s=r.t_sent_s * k,
            ttft_s=None if r.ttft_s is None else r.ttft_s * k,
            itl_s=tuple(x * k for x in r.itl_s),
            e2e_s=None if r.e2e_s is None else r.e2e_s * k,
        )


def check(cfg: TunerConfig) -> None:
    """The simulator's speed-up, before anything is launched."""
    Clock.of(cfg.engine)
