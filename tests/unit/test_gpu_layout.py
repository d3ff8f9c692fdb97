"""The GPU layout (issue 33): ``data_parallel_size`` beside ``tensor_parallel_size``
(``space=gpus``), a trial's GPUs as TP × DP (the lease, the precheck), the flag on the command
line and in the export, ``capacity_per_gpu_rps``, and the simulator's DP replicas."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import optuna
import pytest
from helpers.fake_engine import Loaded, folder
from helpers.models import DEFAULTS, SHAPE

import tuner.capacity_probe as capacity_probe
from tuner import stored_study, stored_trial
from tuner.capacity import Capacity, Start, for_gpus
from tuner.engine.argv import trial_argv
from tuner.engine.pool import GpuPool, gpus_per_server
from tuner.errors import FailureReason, TrialFailed
from tuner.export import to_yaml
from tuner.measure import Replay
from tuner.precheck import precheck
from tuner.score import PER_GPU, needs_capacity
from tuner.sim.cli import parse_args
from tuner.sim.engine import Request, build_scheduler
from tuner.sim.logs import SimLog
from tuner.sim.runtime import AsyncEngine
from tuner.sim.startup import resolve
from tuner.trial import run_server

ROOT = Path(__file__).resolve().parents[2]
FLAGS = ROOT / "tests" / "data" / "vllm-0.24.0-serve-flags.json"


def test_gpus_per_server_is_tp_times_dp() -> None:
    assert gpus_per_server({}) == 1
    assert gpus_per_server({"tensor_parallel_size": None, "data_parallel_size": None}) == 1
    assert gpus_per_server({"tensor_parallel_size": 2}) == 2
    assert gpus_per_server({"data_parallel_size": 2}) == 2
    assert gpus_per_server({"tensor_parallel_size": 2, "data_parallel_size": 2}) == 4


def test_the_flag_reaches_the_argv_and_the_export(make_cfg: Any) -> None:
    cfg = make_cfg("+workload=chat", "space=gpus", "engine.gpus=[0,1]")
    assert cfg.space.params["data_parallel_size"].choices == [1, 2]
    options = json.loads(FLAGS.read_text())["options"]
    assert options["--data-parallel-size"]["dest"] == "data_parallel_size"  # vLLM 0.24.0's flag
    argv = trial_argv(cfg, {"data_parallel_size": 2}, port=1, baseline=False)
    at = argv.index("--data-parallel-size")
    assert argv[at + 1] == "2"
    config, _ = to_yaml(["/m", *argv[at : at + 2]], drop=[])
    assert config == {"model": "/m", "data-parallel-size": 2}  # best-*.yaml, vllm serve --config
    base = trial_argv(cfg, {"data_parallel_size": 1}, port=1, baseline=True)
    assert "--data-parallel-size" not in base  # the baseline passes no searched flag


def test_the_precheck_refuses_a_layout_larger_than_the_pool_in_one_line(make_cfg: Any) -> None:
    cfg = make_cfg("+workload=chat", "engine.gpus=[0,1]")
    params = {**DEFAULTS, "tensor_parallel_size": 2, "data_parallel_size": 2}
    with pytest.raises(TrialFailed) as e:
        precheck(cfg, SHAPE, params, [])
    assert e.value.reason is FailureReason.PRECHECK
    assert e.value.detail == (
        "tensor_parallel_size 2 x data_parallel_size 2 = 4 GPUs exceeds the GPU lease [0, 1]"
    )
    # each replica holds the full weights on its own GPU: DP leaves a GPU's KV memory as it is,
    # TP splits the weights (more KV memory per GPU)
    one = precheck(cfg, SHAPE, {**DEFAULTS, "data_parallel_size": 1}, []).kv_tokens
    dp2 = precheck(cfg, SHAPE, {**DEFAULTS, "data_parallel_size": 2}, []).kv_tokens
    tp2 = precheck(cfg, SHAPE, {**DEFAULTS, "tensor_parallel_size": 2}, []).kv_tokens
    assert one is not None and tp2 is not None
    assert dp2 == one and tp2 > 2 * one


@pytest.mark.parametrize(
    ("params", "leased"),
    [({"data_parallel_size": 2}, (0, 1)), ({"tensor_parallel_size": 2}, (0, 1))],
)
async def test_a_trial_leases_tp_x_dp_gpus_and_records_capacity_per_gpu(
    trial: Any, monkeypatch: pytest.MonkeyPatch, params: dict[str, int], leased: tuple[int, ...]
) -> None:
    monkeypatch.setattr(capacity_probe, "MIN_STEP_REQUESTS", 8)
    overrides = ["space=gpus", "engine.gpus=[0,1,2]", "objective=capacity_per_gpu"]
    overrides += ["objective.capacity.max_steps=2", "workload.arrival.concurrency=1"]
    overrides += ["workload.slo.ttft_ms=125"]
    async with trial(Loaded(per_request_s=0.05), *overrides) as (ctx, _):
        assert needs_capacity(ctx.cfg.objective)
        ctx.pool = GpuPool([0, 1, 2])
        rp = [Replay("", ctx.requests, ctx.cfg.workload)]
        (result,) = await run_server(ctx, 0, params, False, folder(ctx).path, rp, prune=True)
    assert result.failure_reason is None
    assert result.gpus == leased
    words = " ".join(result.argv)
    assert all(f"--{k.replace('_', '-')} {v}" in words for k, v in params.items())
    m = result.metrics
    assert m[PER_GPU] == pytest.approx(m["capacity_rps"] / 2)
    assert result.values is not None and result.values[0] == m[PER_GPU]  # the objective


def test_capacity_per_gpu_and_the_incumbent_probe_scaled_to_the_trials_gpus() -> None:
    cap = Capacity(rps=30.0, low=28.0, high=32.0, factor=3.0, steps=())
    assert PER_GPU not in cap.metrics()  # the GPUs not given: not guessed
    assert cap.metrics(gpus=2)[PER_GPU] == 15.0
    start = Start(4.0, 40.0, gpus=2)  # an incumbent of 20 req/s per GPU on 2 GPUs
    assert for_gpus(start, 1) == Start(2.0, 20.0, 1)  # one GPU must hold 20 req/s to beat it
    assert for_gpus(start, 2) == start and for_gpus(None, 2) is None
    assert for_gpus(Start(4.0, 40.0), 1) == Start(4.0, 40.0)  # ranked by capacity: unscaled

    study = optuna.create_study(directions=["maximize"])
    for rps, per_gpu, factor in ((40.0, 20.0, 4.0), (25.0, 25.0, 2.5)):  # DP=2, then one GPU
        metrics = {"capacity_rps": rps, PER_GPU: per_gpu, "capacity_factor": factor}
        study.add_trial(
            optuna.trial.create_trial(
                value=per_gpu,
                user_attrs={"metrics": {**metrics, "error_rate": 0.0}, "constraints": [-1.0]},
                system_attrs={"constraints": [-1.0]},
            )
        )
    by_rps = stored_study.incumbent_capacity(study, "capacity_rps")
    by_gpu = stored_study.incumbent_capacity(study, PER_GPU)
    assert by_rps == Start(4.0, 40.0)
    assert by_gpu == Start(2.5, 25.0, 1)
    assert for_gpus(by_gpu, 2) == Start(5.0, 50.0, 2)
    # a trial stored with its lease: the GPUs it ran on are read, not a ratio of its metrics
    # (here made to disagree with them, 90 / 30 = 3, so the test tells which one is read)
    metrics = {"capacity_rps": 90.0, PER_GPU: 30.0, "capacity_factor": 9.0, "error_rate": 0.0}
    leased = {"metrics": metrics, "constraints": [-1.0], "gpus": [0, 1]}
    study.add_trial(
        optuna.trial.create_trial(
            value=30.0, user_attrs=leased, system_attrs={"constraints": [-1.0]}
        )
    )
    assert stored_study.incumbent_capacity(study, PER_GPU) == Start(9.0, 90.0, 2)
    assert stored_trial.gpu_count(study.trials[-1]) == 2
    assert stored_trial.gpu_count(study.trials[0]) is None


MODEL = str(ROOT / "models" / "qwen3-8b-dummy")
PROMPTS = [[1000 * i + k for k in range(200)] for i in range(48)]
MAX_TOKENS = 48
SPEEDUP = 2.0


def _settings(flags: tuple[str, ...]) -> Any:
    args = parse_args(["serve", MODEL, "--max-num-seqs", "8", *flags])
    return resolve(args, {"CUDA_VISIBLE_DEVICES": "0,1"})


async def _serve_all(*flags: str) -> float:
    """Every prompt sent at once to a simulated engine with ``flags``: the requests per modelled
    second it serves (from the due times of the last tokens, which the host's speed does not
    move)."""
    engine = AsyncEngine(
        _settings(flags),
        speedup=SPEEDUP,
        stream_interval=1,
        log=SimLog(io.StringIO(), io.StringIO()),
        log_stats=False,
    )
    engine.start()

    async def one(p: list[int]) -> float:
        last = 0.0
        async for _, due in engine.generate(p, MAX_TOKENS):
            last = due
        return last

    sent = engine.wall_at(engine.sim_now())
    try:
        ends = await asyncio.gather(*(one(p) for p in PROMPTS))
    finally:
        await engine.stop()
    return len(PROMPTS) / ((max(ends) - sent) * SPEEDUP)


def _one_engine(*flags: str) -> float:
    """The same requests on one engine's scheduler in virtual time (no server): requests/s."""
    s = _settings(flags)
    sched = build_scheduler(s.shape, s.resolved, s.memory)
    for i, p in enumerate(PROMPTS):
        sched.add(Request(f"r{i}", p, MAX_TOKENS), 0.0)
    t = 0.0
    while sched.has_work:
        t += sched.step(t).duration_s
    return len(PROMPTS) / t


async def test_the_simulator_serves_twice_as_much_with_dp_2_and_its_tp_speed_up_with_tp_2() -> None:
    """Saturating load (48 requests at once, 8 sequences a replica): DP=2 runs two replicas side
    by side, about twice the requests per second of one; TP=2 is one engine whose steps take
    the calibrated TP time (``SpeedModel.for_model``: compute / TP^0.25 plus an all-reduce cost
    per step, slower than TP=1 at 8 sequences), as its scheduler alone runs them."""
    one = await _serve_all()
    dp2 = await _serve_all("--data-parallel-size", "2")
    tp2 = await _serve_all("--tensor-parallel-size", "2")
    assert 1.8 < dp2 / one < 2.2
    assert one == pytest.approx(_one_engine(), rel=0.1)
    assert tp2 / one == pytest.approx(_one_engine("-tp", "2") / _one_engine(), rel=0.05)
