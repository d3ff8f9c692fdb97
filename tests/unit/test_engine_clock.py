"""tuner.engine.clock: whose seconds a replay's records are in. The simulator runs
``TUNER_SIM_SPEEDUP`` times faster than the GPU it models; the tuner measures in the modelled
GPU's time, so its SLOs are judged as on that GPU."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tuner.config import EngineConfig, TunerConfig
from tuner.engine.clock import SPEEDUP_ENV, Clock
from tuner.errors import ConfigError
from tuner.records import RequestRecord, RequestSpec


def test_the_simulators_speedup_is_its_clock_and_vllms_is_one() -> None:
    sim = EngineConfig(kind="sim", env={SPEEDUP_ENV: "2.5"})
    assert Clock.of(sim, environ={}).speedup == 2.5
    assert Clock.of(EngineConfig(kind="vllm", env={SPEEDUP_ENV: "9"}), environ={}).speedup == 1.0
    # as the simulator's process gets it: engine.env over ours, $NAME read from ours, unset 1
    assert Clock.of(EngineConfig(kind="sim"), environ={SPEEDUP_ENV: "3"}).speedup == 3.0
    assert Clock.of(EngineConfig(kind="sim"), environ={}).speedup == 1.0
    ref = EngineConfig(kind="sim", env={SPEEDUP_ENV: "$MY_SPEED"})
    assert Clock.of(ref, environ={"MY_SPEED": "4"}).speedup == 4.0


@pytest.mark.parametrize("bad", ["0", "-2", "fast", "nan"])
def test_a_speedup_that_is_not_a_positive_number_is_one_line(
    bad: str, make_cfg: Callable[..., TunerConfig]
) -> None:
    with pytest.raises(ConfigError, match=f"engine.env.{SPEEDUP_ENV} is '{bad}'; allowed"):
        make_cfg("+workload=chat", "engine=sim", f"engine.env.{SPEEDUP_ENV}={bad}")


def test_records_come_back_in_the_engines_seconds_and_sends_go_out_in_wall_seconds() -> None:
    clock = Clock(4.0)
    r = RequestRecord(
        index=1,
        status="ok",
        t_sent_s=0.5,
        ttft_s=0.1,
        itl_s=(0.01, 0.02),
        e2e_s=0.25,
        output_tokens=3,
    )
    m = clock.modelled(r)
    assert (m.t_sent_s, m.ttft_s, m.itl_s, m.e2e_s) == (2.0, 0.4, (0.04, 0.08), 1.0)
    assert m.tpot_s == pytest.approx(4 * r.tpot_s)  # type: ignore[operator]
    failed = RequestRecord(index=2, status="error", t_sent_s=1.0)
    assert clock.modelled(failed) == RequestRecord(index=2, status="error", t_sent_s=4.0)
    specs = [
        RequestSpec(0, "chat", {}, 1, 1, arrival_s=2.0),
        RequestSpec(1, "chat", {}, 1, 1, arrival_s=None),
    ]
    assert [s.arrival_s for s in clock.wall_requests(specs)] == [0.5, None]
    assert clock.wall_s(120.0) == 30.0
    assert Clock().modelled(r) is r and Clock().wall_requests(specs) == specs
