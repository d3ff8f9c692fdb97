"""objective=capacity through the CLI on the simulator: each trial's SLO capacity, its bracket
and steps in Optuna, MLflow and the trial folder; the defaults measured on fresh servers agree."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path
from typing import Any

import optuna
import pytest
from helpers.capacity import BINDING_SLOS
from helpers.cli import mlflow_runs, storage, tuner

from tuner.capacity_probe import OWN_REPLAY_LOST

pytestmark = pytest.mark.integration

# the SLOs bind at a few requests/s (helpers.capacity)
SMALL = [
    *BINDING_SLOS,
    "confirm.enabled=false",
    "workload.num_requests=100",
    "objective.capacity.max_steps=7",
]
# the workload's own replay (4 in flight, far below the capacity: the first step, held) cut to
# 30 requests, its 100 at 4 in flight ~5 s of each search; the later steps still measure 100
# requests each (objective.capacity.requests), as with SMALL alone
SHORT_OWN = ["workload.num_requests=30", "objective.capacity.requests=100"]


def test_capacity_recorded_and_the_defaults_agree(tmp_path: Path) -> None:
    # vLLM's defaults on three fresh servers: each trial's capacity, bracket and steps in Optuna,
    # the trial folder and MLflow, and the three capacities close to each other; then the same
    # config from twice the load and with twice the requests per step, within that spread
    # each trial brackets its own capacity (no incumbent probe): the spread of one config's
    p = tuner(
        tmp_path, *SMALL, *SHORT_OWN, "space=none", "study.n_trials=3",
        "objective.capacity.incumbent_probe=false", "objective.capacity.predict_start=false",
        timeout=900,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    assert "SLO capacity" in p.stderr + p.stdout
    study = optuna.load_study(study_name="chat-qwen3-8b-sim-capacity", storage=storage(tmp_path))
    assert len(study.trials) == 3
    for t in study.trials:
        m = t.user_attrs["metrics"]
        assert m["capacity_rps_low"] <= m["capacity_rps"] <= m["capacity_rps_high"]
        assert not m["capacity_censored"]  # the SLOs bind inside the loads tried
        assert t.values[0] == pytest.approx(m["capacity_rps"])
        tdir = Path(t.user_attrs["trial_dir"])
        steps = json.loads((tdir / "capacity.json").read_text())["steps"]
        assert len(steps) == m["capacity_steps"] >= 2
        assert steps[0]["factor"] == 1.0  # the workload's own replay is the first step
        assert (tdir / "capacity_1" / "requests.jsonl").is_file()
        factors = [s["factor"] for s in steps]
        assert len(factors) == len(set(factors))  # no load tried twice
        held = [s["factor"] for s in steps if s["held"]]
        failed = [s["factor"] for s in steps if not s["held"]]
        assert held and failed and max(h for h in held if h < min(failed)) < min(failed)
    # (max - min) / mean. Since the simulator keeps its modelled clock (issue 34, its lag is
    # reported, benchmarks/sim_repeatability.py): 3.0 and 3.6 % idle, 5.2 % with one of the two
    # cores busy (2026-12-02), its lag under 25 ms at p99 at these loads. What is left is the
    # replays' own sampling: the step at 17 in flight (4.25x) held by +0.02 in two trials and
    # failed by 0.001 in the third, which moves the bracket one slot (~3 %). Before the clock was
    # fixed: 2.3-2.4 % idle, 2.9-5.7 % beside another test suite, 11.7 % once in CI. The 5 %
    # target held on the H200 (3.7 %, docs/gpu-runs/2026-12-01-capacity.md). The bound is 8 %
    # plus one slot of the closed loop at the capacity (~6 % at ~17 in flight), the bracket's
    # own resolution, as for the moved starts below: 8 % alone failed in two fresh-clone CI runs
    # on 2 cores (2026-12-03: 8.8 % with nothing beside it, 12.5 % beside other tests), where a
    # slot and the sampling together can reach 9 %. It still fails a search that brackets or
    # interpolates wrongly (tests/unit/test_capacity.py checks the arithmetic). Two CI runs
    # (2026-12-03) read one server 18 % and 40 % low: a stall of the host in one step, which
    # the search now replays (the stall test below).
    caps = [t.user_attrs["metrics"]["capacity_rps"] for t in study.trials]
    mean = statistics.fmean(caps)
    in_flight = 4 * statistics.fmean(
        t.user_attrs["metrics"]["capacity_factor"] for t in study.trials
    )
    slot = 1 / in_flight
    assert (max(caps) - min(caps)) / mean <= 0.08 + slot, (caps, in_flight, _steps(study))

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    children = [
        r
        for r in mlflow_runs(tmp_path, "chat-qwen3-8b-sim-capacity")
        if r.data.tags.get("tuner.role") == "trial"
    ]
    assert len(children) == 3
    for c in children:
        d = c.data.metrics
        assert d["capacity_rps_low"] <= d["capacity_rps"] <= d["capacity_rps_high"]
        history = client.get_metric_history(c.info.run_id, "capacity_step.factor")
        assert len(history) == d["capacity_steps"]  # each step's metrics, one MLflow step each

    # issue 29, item 3: one config's capacity, wherever it is measured, moves by less than its
    # spread between fresh servers: from twice the load (the confirm stage's start,
    # confirm.load_factor 2) and with twice the requests per step (its duration_factor 2), each
    # on a fresh server. A closed loop's start (every slot at once) and its drain are not
    # counted (tuner.measure.unsteady_indices); counted, the capacity moved with the replay's
    # length (docs/gpu-runs/2026-12-02-levers-chat.md).
    # "Its spread": the 8 % three fresh servers may differ by (above). At ~17 in flight one slot
    # is 6 % of the load, and a step's p95 over its 100 counted requests moves its margin by
    # ~0.03 between runs, so one run's bracket can end a slot lower (CI, 2026-12-02: 33.9-34.3
    # req/s from 4 in flight on three servers, 32.0 from 8 in flight: it failed at 17 in flight
    # by -0.032 where the three held by +0.018). At full speed (helpers.capacity, 2026-12-02):
    # 63.45-63.77 req/s on three servers, 65.7 from 8 in flight, 66.4 with 200 requests a step;
    # in a fresh-clone CI run the same day 63.7-65.0 on three servers and 69.4 (+8.2 %) with 200
    # requests a step. One reason a longer step read higher: a step of another length counts
    # other requests, and drawn independently their mean lengths differed by a few % (chat's output
    # tokens by 2.1 % between seeds 0 and 1 at 470 in flight); the streams are stratified since
    # 2026-12-05 (tests/unit/test_stream_mix.py). After that, 4 fresh servers each (these
    # settings, 2026-12-05): 68.78-71.65 req/s (mean 70.61, spread 4.1 %) with 100 requests a
    # step, 71.82-73.54 (+2.4 %) with 200, 71.13-71.49 (+1.0 %) with 400, 70.39-71.23 (+0.4 %)
    # from 8 in flight: within the servers' spread. What is left is the bracket's resolution:
    # one slot of the closed loop at the capacity (~6 % at ~17 in flight), where a step's p95
    # over 100 counted requests can hold in one run and fail in another. So the room is the
    # spread plus one slot.
    room = (0.08 + slot) * mean
    for k, extra in enumerate(
        ("workload.arrival.concurrency=8", "objective.capacity.requests=200")
    ):
        name = f"moved-{k}"
        p = tuner(
            tmp_path, *SMALL, *SHORT_OWN, "space=none", "study.n_trials=1",
            "objective.capacity.incumbent_probe=false", "objective.capacity.predict_start=false",
            "tracking=none", f"study.name={name}", extra, timeout=600,
        )  # fmt: skip
        assert p.returncode == 0, p.stderr[-3000:]
        moved = optuna.load_study(study_name=name, storage=storage(tmp_path)).trials[0]
        x = moved.user_attrs["metrics"]["capacity_rps"]
        assert abs(x - mean) <= room, (extra, x, caps, _steps(study), _steps_of(moved))


def test_the_first_trial_goes_to_the_capacity_the_simulator_predicts(tmp_path: Path) -> None:
    # before the study has a capacity, the first trial's search goes from its own replay to the
    # landscape's prediction for its config (tuner.prescreen.predict_start): the simulated
    # server's own model in virtual time, so the live search agrees with it within the spread
    # of fresh servers (8 %, above) and stays near it: 3 steps when the held load holds live
    # and the climb from it fails, 5 when that climb overshoots by a slot or two and the
    # bracket narrows (CI, 2026-12-03: 3.75x held, 4.5x failed), 6 when it overshoots by a
    # quarter (CI, 2026-12-05: 4.0x held, 5.0x failed by 2.8 %, then three halvings); from the
    # workload's load it doubles until a load fails (4x) and narrows back: 6 (2026-12-03), but
    # through 2x, far below the prediction
    p = tuner(
        tmp_path, *SMALL, *SHORT_OWN, "space=none", "study.n_trials=1", "tracking=none", timeout=600
    )
    assert p.returncode == 0, p.stderr[-3000:]
    out = p.stdout + p.stderr
    said = re.search(r"predicts an SLO capacity of ([\d.]+)x .*?\(([\d.]+) req/s", out)
    assert said, out[-3000:]
    factor, rps = float(said[1]), float(said[2])
    t = optuna.load_study(
        study_name="chat-qwen3-8b-sim-capacity", storage=storage(tmp_path)
    ).trials[0]
    m = t.user_attrs["metrics"]
    steps = json.loads((Path(t.user_attrs["trial_dir"]) / "capacity.json").read_text())["steps"]
    assert steps[1]["factor"] == pytest.approx(factor, abs=0.25)  # whole slots: 4 in flight
    # within the spread of fresh servers plus one slot of the closed loop at the capacity (the
    # bracket's resolution), the room the test above gives: 8 % alone failed in a fresh-clone CI
    # run (2026-12-05: 73.8 req/s against 67.9 predicted, +8.7 %); 8 runs on this
    # 2-core VM the same day read 68.4-72.6 req/s at 4.4-4.8x (~18 in flight, a slot 5.5 %)
    slot = 1 / (4 * m["capacity_factor"])
    assert abs(m["capacity_rps"] - rps) <= (0.08 + slot) * rps, (m["capacity_rps"], rps, steps)
    assert m["capacity_steps"] <= 6, steps
    near = [x["factor"] for x in steps[1:]]  # every step after the workload's own load
    assert all(0.75 * factor <= f <= 1.5 * factor for f in near), (factor, near)


def _steps_of(t: optuna.trial.FrozenTrial) -> list[str]:
    """A trial's capacity steps in one line each (load, margin, the host's lag, why pruned): what
    a failure message needs to tell a config's capacity from the CI host's stalls."""
    rows = json.loads((Path(t.user_attrs["trial_dir"]) / "capacity.json").read_text())["steps"]
    return [
        f"trial {t.number} x{r['factor']:.3g}: {r['rps']:.1f} req/s margin {r['margin']:+.3f} "
        f"client lag max {r.get('client_lag_max_ms', float('nan')):.1f} ms, simulator lag max "
        f"{r.get('sim_lag_max_ms', float('nan')):.1f} ms{', pruned' if r['pruned'] else ''}"
        for r in rows
    ]


def _steps(study: optuna.Study) -> list[str]:
    return [line for t in study.trials for line in _steps_of(t)]


def _stalled_trial(
    tmp_path: Path, name: str, *extra: str
) -> tuple[optuna.trial.FrozenTrial, dict[str, Any], str]:
    """One trial of vLLM's defaults on the small workload, its capacity searched from its own
    load without a start (``extra``: the load, ``TUNER_SIM_STALL``, ``stall_ms``): the trial,
    its ``capacity.json`` and the run's output."""
    p = tuner(
        tmp_path, *SMALL, "space=none", "study.n_trials=1", "objective.capacity.incumbent_probe=false",
        "objective.capacity.predict_start=false", "tracking=none", f"study.name={name}", *extra,
        timeout=600,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    (t,) = optuna.load_study(study_name=name, storage=storage(tmp_path)).trials
    cap = json.loads((Path(t.user_attrs["trial_dir"]) / "capacity.json").read_text())
    return t, cap, p.stdout + p.stderr


def test_a_stall_of_the_host_is_replayed_not_measured(tmp_path: Path) -> None:
    # the simulated server stops for 1 s at the 162nd request, as a busy CI host stops it: in the
    # search's step at 2x the workload's load (12 in flight; the workload's own replay sends 101
    # requests, the step 1 warm-up and then 124, so the 162nd is the 60th measured, counted
    # from the 13th to the 112th). Measured as is, the ~12 requests decoding when it struck
    # fail the TPOT SLO (10 ms: +30-60 ms each), 10 % of those counted, so that step fails and
    # the capacity reads lower. Replayed once (objective.capacity.stall_ms), the search goes on
    # from the second replay. 12 in flight lies far below the capacity (~18), so a busy host
    # alone does not fail that step. Until 2026-12-06 the stall was at the 280th request, in
    # the step at 4x (16 in flight, ~10 % under the capacity); a fresh-clone CI run then found
    # no step replayed, as the scraper's read in flight at the pruned step's end was cancelled
    # with the stall in it (tuner/telemetry/prom.py). Until 2026-12-05 it was in the step at 2x
    # of 4 in flight (8), where the 5-7 requests it struck of 100 counted put the step's TPOT
    # p95 on the SLO's edge.
    def run(name: str, *extra: str) -> tuple[optuna.trial.FrozenTrial, dict[str, Any], str]:
        return _stalled_trial(
            tmp_path,
            name,
            "workload.arrival.concurrency=6",
            "+engine.env.TUNER_SIM_STALL=162:1",
            *extra,
        )

    t, cap, out = run("stalled")
    assert len(cap["repeated"]) == 1, (cap["repeated"], _steps_of(t))
    (voided,) = cap["repeated"]
    assert voided["factor"] == 2.0 and voided["stall_ms"] >= 500, voided
    assert (Path(t.user_attrs["trial_dir"]) / voided["replay"] / "requests.jsonl").is_file()
    assert "the simulator stalled" in out and "replaying it once" in out
    again = [s for s in cap["steps"] if s["factor"] == 2.0]
    assert again and again[0]["held"] and again[0]["sim_lag_max_ms"] < 100, _steps_of(t)
    replayed = t.user_attrs["metrics"]["capacity_rps"]
    assert replayed > 53, _steps_of(t)  # ~64 unstalled

    # the same stall measured as is: what the replay saves the search from. The stalled step
    # fails, and the search narrows below it, between 6 and 12 in flight (2026-12-06: 50.4 req/s
    # held at 1.83x against 69.1 replayed, 4 replays)
    t, cap, _ = run("measured", "objective.capacity.stall_ms=0", "objective.capacity.max_steps=4")
    assert cap["repeated"] == []
    (stalled,) = [s for s in cap["steps"] if s["factor"] == 2.0]
    assert not stalled["held"] and stalled["sim_lag_max_ms"] >= 500, _steps_of(t)
    assert t.user_attrs["metrics"]["capacity_rps"] < 0.95 * replayed, _steps_of(t)


def test_a_loss_in_the_workloads_own_replay_is_measured_again_as_a_step(tmp_path: Path) -> None:
    # the simulated server stops for 1 s at the 50th request, in the workload's own replay (8 in
    # flight, 100 measured, the middle 84 counted): the ~8 requests decoding then fail the TPOT
    # SLO (10 ms: +30-60 ms each), 9-10 % of those counted, and that replay loses at a load far
    # below the capacity (~18 in flight). Stalls are not voided here (stall_ms=0): the workload's
    # own replay is measured as no step is (the quick start's lost first replays, on TTFT with
    # no stall over 500 ms, capacity_probe.OWN_REPLAY_LOST), and its loss is measured again
    # as a step at the same load, from which the search goes on.
    t, cap, out = _stalled_trial(
        tmp_path, "own", "workload.arrival.concurrency=8", "objective.capacity.stall_ms=0",
        "+engine.env.TUNER_SIM_STALL=50:1",
    )  # fmt: skip
    (lost,) = cap["repeated"]
    assert lost["why"] == OWN_REPLAY_LOST and lost["factor"] == 1.0 and not lost["held"], lost
    assert lost["replay"] == "." and lost["sim_lag_max_ms"] >= 500, lost
    assert "measured again there as a capacity step" in out
    first = cap["steps"][0]
    assert first["factor"] == 1.0 and first["held"], _steps_of(t)
    assert t.user_attrs["metrics"]["capacity_factor"] > 1.5, _steps_of(t)  # ~2.1 (18 / 8)


def test_a_stall_while_the_own_replays_loss_is_measured_again_is_replayed(tmp_path: Path) -> None:
    # as above, the workload's own replay loses on a 1 s stall, kept as a loss (under stall_ms,
    # here 1.5 s); then a 3 s stall strikes its measurement again, a capacity step at 1x (the
    # 170th request: the own replay sends ~110, the step a warm-up and then its counted span).
    # That step is measured as any other: voided and replayed once (capacity_probe.probe), so
    # the search goes on from a held 1x. Until 2026-12-06 (24528ea) it was measured once, as is: the
    # stalled step lost, and the capacity read below the workload's own load.
    t, cap, out = _stalled_trial(
        tmp_path, "own_stalled", "workload.arrival.concurrency=8", "objective.capacity.stall_ms=1500",
        "+engine.env.TUNER_SIM_STALL='50:1,170:3'",
    )  # fmt: skip
    lost, voided = cap["repeated"]
    assert lost["why"] == OWN_REPLAY_LOST and 500 <= lost["sim_stall_ms"] < 1500, lost
    assert voided["factor"] == 1.0 and voided["stall_ms"] >= 1500, voided
    assert voided["replay"] == "capacity_1" and not voided["held"], voided
    assert "replaying it once" in out
    first = cap["steps"][0]
    assert first["factor"] == 1.0 and first["held"] and first["sim_stall_ms"] < 100, _steps_of(t)
    assert t.user_attrs["metrics"]["capacity_factor"] > 1.5, _steps_of(t)  # ~2.1 (18 / 8)
