"""Whole studies through the CLI (`python -m tuner`), the simulator as the engine, in a temp cwd."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
from helpers import reference
from helpers.cli import (
    FAST,
    main_in_process,
    mlflow_client,
    mlflow_runs,
    run_study,
    storage,
    tuner,
)
from helpers.procs import kill_9_once_serving, kill_9_when, marked_pids
from helpers.reference import Reference
from helpers.trials import counted, dashboard_constraints, pareto_front_kinds

import tuner.study as study_mod
from tuner import stored_trial
from tuner.config import TunerConfig
from tuner.errors import ConfigError
from tuner.space import distributions
from tuner.storage import open_study, storage_url
from tuner.stored_study import ConfirmRecord

pytestmark = pytest.mark.integration


@pytest.mark.fast
def test_a_study_records_everything(reference_study: Reference, tmp_path: Path) -> None:
    cwd = reference_study.cwd
    assert "Pareto-best trials" in reference_study.stdout
    study = optuna.load_study(study_name=reference.STUDY, storage=storage(cwd))
    assert len(counted(study.trials)) == 4  # configs refused before launch do not count
    first = study.trials[0]
    assert first.user_attrs["baseline"] is True
    assert first.user_attrs["failure_reason"] is None
    assert first.user_attrs["kv_cache_tokens"] > 0
    constraints = stored_trial.constraints(first)
    assert constraints["error_rate"] == pytest.approx(-0.05)
    assert constraints["failed_no_kv_memory"] == 0.0
    assert all(v <= 0 for v in constraints.values()), constraints
    assert {"slo_ttft", "slo_tpot"} <= set(constraints)  # the chat profile's SLOs

    runs = mlflow_runs(cwd, reference.STUDY)
    parents = [r for r in runs if r.data.tags.get("tuner.role") == "study"]
    children = [r for r in runs if r.data.tags.get("tuner.role") == "trial"]
    assert len(parents) == 1 and len(children) == len(study.trials)
    for c in children:
        assert c.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        assert {"engine", "model", "workload", "tuner.version", "vllm.version"} <= set(c.data.tags)
        assert len(c.data.metrics) >= 8
        assert "argv" in c.data.params
    ok = [c for c in children if c.data.tags["trial.state"] == "ok"]
    assert ok, "the baseline trial must succeed on the simulator"
    m = ok[0].data.metrics
    for key in (
        "output_throughput",
        "ttft_p95_ms",
        "tpot_p50_ms",
        "e2e_p99_ms",
        "success_rate",
        "kv_cache_tokens",
        "startup_s",
    ):
        assert key in m, key
    client = mlflow_client(cwd)
    names = {a.path for a in client.list_artifacts(ok[0].info.run_id)}
    assert {"server.log", "requests.jsonl", "result.json", "metrics.jsonl"} <= names
    parent_files = {a.path for a in client.list_artifacts(parents[0].info.run_id)}
    assert {"pareto.html", "pareto.json", "best-goodput.yaml", "latency_cdf.html"} <= parent_files
    # the run folder's pages load plotly.min.js beside them; MLflow's copies carry it inline
    run_dir = next((cwd / "outputs" / "runs").glob("*/pareto.html")).parent
    assert 'src="plotly.min.js"' in (run_dir / "pareto.html").read_text()
    assert (run_dir / "plotly.min.js").stat().st_size > 1_000_000
    assert "plotly.min.js" not in parent_files
    logged = Path(client.download_artifacts(parents[0].info.run_id, "pareto.html", str(tmp_path)))
    assert "plotly.min.js" not in logged.read_text() and logged.stat().st_size > 1_000_000
    pareto = json.loads(next((cwd / "outputs" / "runs").glob("*/pareto.json")).read_text())
    assert pareto and all("output_throughput_vs_baseline_pct" in row for row in pareto)


def test_infeasible_trials_are_recorded_not_crashed(
    tmp_path: Path,
    make_cfg: Callable[..., TunerConfig],
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Qwen3-8B at gmu 0.10/0.11 (other flags at vLLM's defaults): weights + activations leave no
    # room for KV blocks. Enqueued, so the sampler's own choices cannot mix in other failures.
    cfg = make_cfg(  # in this process: the CLI is not what is tested
        "+workload=chat",
        "space=full",  # the default space has no infeasible corner
        "study.n_trials=2",
        "study.name=tiny",
        "study.baseline_first=false",
        "study.precheck=false",  # launch them: this test is about vLLM's refusal as data
        "study.enqueue=[{gpu_memory_utilization:0.10},{gpu_memory_utilization:0.11}]",
        "space.params.gpu_memory_utilization.low=0.10",
        "space.params.gpu_memory_utilization.high=0.12",
        "confirm.enabled=false",
        *FAST,
    )
    out = run_study(cfg, capsys, caplog)
    study = optuna.load_study(study_name="tiny", storage=storage_url(cfg))
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * 2
    assert [t.params["gpu_memory_utilization"] for t in study.trials] == [0.10, 0.11]
    for t in study.trials:
        assert t.user_attrs["failure_reason"] == "no_kv_memory"
        assert "No available memory for the cache blocks" in t.user_attrs["failure_detail"]
        assert stored_trial.constraints(t)["failed_no_kv_memory"] == 1.0
        assert stored_trial.constraints(t)["slo_ttft"] > 0
        assert t.user_attrs["predicted_kv_tokens"] == 0
        assert t.user_attrs["launched"] is True
    children = [
        r for r in mlflow_runs(tmp_path, "tiny") if r.data.tags.get("tuner.role") == "trial"
    ]
    assert {c.data.tags["failure_reason"] for c in children} == {"no_kv_memory"}
    assert {c.info.status for c in children} == {"FAILED"}
    assert "No feasible trial yet" in out


@pytest.mark.parametrize("workload", ["long_docs", "image_heavy"])
def test_other_workloads_complete(make_cfg: Callable[..., TunerConfig], workload: str) -> None:
    cfg = make_cfg(  # in this process: the CLI is not what is tested
        f"+workload={workload}",
        "study.n_trials=1",
        "tracking=none",
        "workload.num_requests=4",
        "workload.warmup_requests=0",
        "workload.output_tokens.low=8",
        "workload.output_tokens.high=16",
        "engine.env.TUNER_SIM_SPEEDUP=20",
        "confirm.enabled=false",
        # the default objective's search, cut to one step after the workload's own replay: a
        # step at another load of these requests is what runs (the whole search took 23-44 s)
        "objective.capacity.max_steps=2",
    )
    study_mod.run(cfg)
    study = optuna.load_study(
        study_name=f"{workload}-qwen3-8b-sim-capacity", storage=storage_url(cfg)
    )
    t = study.trials[0]
    assert t.user_attrs["failure_reason"] is None, t.user_attrs["failure_detail"]
    assert t.user_attrs["metrics"]["completed"] == 4
    assert t.user_attrs["metrics"]["capacity_steps"] == 2
    result = json.loads((Path(cfg.paths.output_dir) / "trial_0000" / "result.json").read_text())
    assert result["metrics"]["prompt_tokens_mean"] > 0


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["+workload=nope"], "allowed: chat, image_heavy, long_docs"),
        (["+workload=chat", "space.params.gpu_memory_utilization.high=1.5"], "0 < x <= 1"),
        (["engine=gpu9000", "+workload=chat"], "allowed: docker, sim, vllm"),
        ([], "+workload=NAME"),
        (["+workload=chat", "study.repeats=0"], "allowed: 1 to 20"),
        (["+workload=chat", "study.timeout_s=0"], "allowed: seconds > 0, or null"),
        (["+workload=chat", "study.deadline_s=-60"], "study.deadline_s is -60.0; allowed:"),
        (["+workload=chat", "+study.ntrials=5"], "key study.ntrials; the closest known key is"),
        (["+workload=chat", "study.ntrials=5"], "key study.ntrials; the closest known key is"),
    ],
)
@pytest.mark.fast
def test_bad_input_fails_fast_with_one_line(
    tmp_path: Path,
    args: list[str],
    needle: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # the CLI's main() in this process; test_bad_input_exits_2_from_the_cli runs the command
    code, _, err = main_in_process(tmp_path, *args, monkeypatch=monkeypatch, capsys=capsys)
    assert code == 2
    err = err.strip()
    assert needle in err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "outputs").exists(), "no run folder, no storage"


@pytest.mark.fast
@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["+workload=nope"], "allowed: chat, image_heavy, long_docs"),  # before Hydra composes
        (["+workload=chat", "study.repeats=0"], "allowed: 1 to 20"),  # after, in the app
    ],
)
def test_bad_input_exits_2_from_the_cli(tmp_path: Path, args: list[str], needle: str) -> None:
    p = tuner(tmp_path, *args, timeout=60)
    assert p.returncode == 2
    err = p.stderr.strip()
    assert needle in err
    assert "Traceback" not in p.stdout + p.stderr and len(err.splitlines()) == 1, err
    assert not (tmp_path / "outputs").exists(), "no run folder, no storage"


@pytest.mark.fast
def test_a_bad_trace_row_is_found_before_anything_is_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # it was once reported after the study had been created, and left an empty run folder
    trace = tmp_path / "trace.csv"
    trace.write_text("timestamp,input_length,output_length\n0.0,100,20\n0.5,many,20\n")
    args = ["+workload=trace", f"workload.trace.path={trace}"]
    code, _, err = main_in_process(tmp_path, *args, monkeypatch=monkeypatch, capsys=capsys)
    assert code == 2
    assert err.strip() == (
        f"error: row 2 of {trace}: input_tokens 'many' (column input_length) is not an integer"
    )
    assert not (tmp_path / "outputs").exists(), "no run folder, no storage"


def test_the_same_seed_draws_the_same_start_up_configs(tmp_path: Path) -> None:
    """Two single-worker runs of one command on fresh storage. TPE draws a trial at random until
    ``study.n_startup_trials`` trials have finished (the baseline and configs the precheck refuses
    count, and are the same in both runs): with one worker those are trials 0 to 3, and their
    params must be equal. Later trials follow the measured values, which the simulator's timing
    varies, so they may differ. The seed once mixed in the tuner's host:pid."""
    startup = 4
    params = []
    for run in ("a", "b"):
        cwd = tmp_path / run
        cwd.mkdir()
        p = tuner(
            cwd,
            "+workload=chat",
            "study.n_trials=3",
            f"study.n_startup_trials={startup}",
            "study.seed=3",
            "tracking=none",
            "confirm.enabled=false",
            *FAST,
        )
        assert p.returncode == 0, p.stderr[-3000:]
        trials = optuna.load_study(study_name="chat-qwen3-8b-sim", storage=storage(cwd)).trials
        params.append([t.params for t in trials if t.number < startup])
    assert len(params[0]) >= 3  # the baseline and at least two sampled configs
    assert params[0] == params[1]


@pytest.mark.fast
def test_a_missing_engine_command_stores_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # it once created the study, then failed its first trial with no reason stored
    args = ["+workload=chat", "engine=vllm", "engine.command=[tuner-no-such-vllm,serve]"]
    code, _, err = main_in_process(tmp_path, *args, monkeypatch=monkeypatch, capsys=capsys)
    assert code == 2
    assert err.strip() == (
        "error: engine.command 'tuner-no-such-vllm' is not found on PATH: install vLLM "
        "(pip install -e '.[vllm]') or set engine.command"
    )
    assert not (tmp_path / "outputs").exists(), "no run folder, no storage"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_leaves_no_process_and_records_the_trial(
    tmp_path: Path, sig: signal.Signals
) -> None:
    mark = f"TUNER_TEST_MARK={uuid.uuid4().hex}"
    env = {**os.environ, mark.split("=")[0]: mark.split("=")[1]}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tuner",
            "+workload=chat",
            "study.n_trials=5",
            "engine.env.TUNER_SIM_SPEEDUP=1",
            "workload.num_requests=400",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # wait until a server is up and replaying
            logs = list(tmp_path.glob("outputs/runs/*/trial_0000/server.log"))
            if logs and "Application startup complete" in logs[0].read_text():
                break
            time.sleep(0.2)
        else:
            pytest.fail("no server came up")
        assert len(marked_pids(mark)) >= 3  # tuner + API server + EngineCore
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 130, out[-2000:]
        time.sleep(0.5)
        assert marked_pids(mark) == [], "a process started by the tuner survived"
        study = optuna.load_study(
            study_name="chat-qwen3-8b-sim-capacity", storage=storage(tmp_path)
        )
        (trial,) = study.trials
        # the tuner's output says why, should the trial be left RUNNING (seen once in 10 runs
        # beside CPU hogs, 2026-12-03, its output not kept)
        assert trial.state == optuna.trial.TrialState.FAIL, out[-4000:]
        assert stored_trial.failure_reason(trial) == "interrupted"
        runs = mlflow_runs(tmp_path, "chat-qwen3-8b-sim-capacity")
        (parent,) = [r for r in runs if r.data.tags.get("tuner.role") == "study"]
        (child,) = [r for r in runs if r.data.tags.get("tuner.role") == "trial"]
        assert (parent.info.status, child.info.status) == ("KILLED", "FAILED")
        assert "interrupted" in parent.data.tags["killed_reason"]
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert child.data.tags["failure_reason"] == "interrupted"
        assert child.data.tags["trial.number"] == "0"
        assert "server.log" in {
            a.path for a in mlflow_client(tmp_path).list_artifacts(child.info.run_id)
        }
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.fast
def test_secrets_never_reach_what_the_tuner_writes(reference_study: Reference) -> None:
    """HF_TOKEN by environment and an --api-key flag (the reference study has both): the server
    gets both, nothing written shows them, not even the debug log of the launch line
    (``hydra.verbose=tuner``), nor the confirm stage's servers and exports."""
    hf, key = reference.HF_TOKEN, reference.API_KEY
    cwd = reference_study.cwd
    study = optuna.load_study(study_name=reference.STUDY, storage=storage(cwd))
    trial = study.trials[0]
    assert trial.user_attrs["failure_reason"] is None  # the replay authenticated with the key
    assert trial.user_attrs["metrics"]["success_rate"] == 1.0
    server_log = next(cwd.glob("outputs/runs/*/trial_0000/server.log")).read_text()
    # the simulator logs its non-default args, as vLLM does: the key is not among them (it
    # travels as VLLM_API_KEY), so no kill -9 of the tuner can leave it in the log
    assert "non-default args" in server_log and "api_key" not in server_log
    job_log = next(cwd.glob("outputs/runs/*/__main__.log")).read_text()
    assert "started pid" in job_log  # the launch line, logged at DEBUG
    written = [f for f in cwd.rglob("*") if f.is_file() and "vllm_cache" not in f.parts]
    assert len(written) > 5
    for f in written:  # run dir, artifacts, Hydra's log, Optuna and MLflow databases
        data = f.read_bytes()
        assert hf.encode() not in data and key.encode() not in data, f
    out = reference_study.stdout + reference_study.stderr
    assert hf not in out and key not in out
    runs = mlflow_runs(cwd, reference.STUDY)
    for r in runs:
        blob = json.dumps([r.data.params, r.data.tags])
        assert hf not in blob and key not in blob


def test_precheck_skips_certain_failures_and_counts_gpu_time(
    make_cfg: Callable[..., TunerConfig],
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    cfg = make_cfg(  # in this process: the CLI is not what is tested
        "+workload=chat",
        "space=full",  # the default space has no infeasible corner
        "study.n_trials=3",
        "study.name=pre",
        "study.enqueue=[{gpu_memory_utilization:0.11},"
        "{enable_chunked_prefill:false,max_num_batched_tokens:2048}]",
        "confirm.enabled=false",
        *FAST,
    )
    out = run_study(cfg, capsys, caplog)
    study = optuna.load_study(study_name="pre", storage=storage_url(cfg))
    base, low, chunk = study.trials[:3]
    assert base.user_attrs["launched"] is True and base.user_attrs["failure_reason"] is None
    assert low.user_attrs["launched"] is False
    assert low.user_attrs["failure_reason"] == "no_kv_memory"
    assert low.user_attrs["failure_detail"].startswith("predicted before launch: No available")
    assert chunk.user_attrs["failure_reason"] == "invalid_config"
    assert chunk.user_attrs["launched"] is False
    assert not (Path(cfg.paths.output_dir) / "trial_0001" / "server.log").exists()
    # the rejected configs cost no GPU time and do not count: 3 trials were launched
    rejected = [t for t in study.trials if t.user_attrs["launched"] is False]
    assert len(study.trials) - len(rejected) == 3
    assert f"{len(rejected)} trial(s) rejected before launch" in out
    assert "[not counted] trial 1: FAILED no_kv_memory" in out
    assert "[not counted] trial 2: FAILED invalid_config" in out
    assert "(0.0%) on launches that failed" in out
    # Optuna's own tools see the refused configs as infeasible, not as trials at the penalty
    # values: its Pareto plot, and optuna-dashboard (which reads only the constraints list)
    assert stored_trial.feasible(base)
    kinds = pareto_front_kinds(study)
    assert kinds[low.number] == kinds[chunk.number] == "Infeasible"
    assert kinds[base.number] in ("Best", "Feasible")
    shown = dashboard_constraints(storage_url(cfg), "pre")
    for refused in (low, chunk):  # an empty list would show as feasible there
        assert shown[refused.number] and max(shown[refused.number]) > 0, shown
    assert shown[base.number] and max(shown[base.number]) <= 0
    assert len(shown[base.number]) == len(stored_trial.constraints(base))


def test_rejections_count_past_max_rejected(
    make_cfg: Callable[..., TunerConfig],
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # every config of this space is refused before launch (gmu <= 0.11 does not hold the weights)
    cfg = make_cfg(  # in this process: the CLI is not what is tested
        "+workload=chat",
        "space=full",  # the default space has no infeasible corner
        "study.n_trials=2",
        "study.max_rejected=3",
        "study.baseline_first=false",
        "study.name=norej",
        "space.params.gpu_memory_utilization.low=0.10",
        "space.params.gpu_memory_utilization.high=0.11",
        "space.params.quantization.enabled=false",  # fp8 weights would fit
        *FAST,
    )
    out = run_study(cfg, capsys, caplog)
    study = optuna.load_study(study_name="norej", storage=storage_url(cfg))
    assert len(study.trials) == 3 + 2  # 3 free rejections, then 2 that count
    assert all(t.user_attrs["launched"] is False for t in study.trials)
    assert all(stored_trial.violated(t) for t in study.trials)
    assert out.count("[not counted]") == 3
    assert "[1/2]" in out and "[2/2]" in out
    assert "the precheck has rejected 3 configs in this run (study.max_rejected)" in out


def test_replay_is_pruned_once_the_slo_is_lost(
    tmp_path: Path, make_cfg: Callable[..., TunerConfig]
) -> None:
    cfg = make_cfg(  # in this process: the CLI is not what is tested
        "+workload=chat",
        "study.n_trials=1",
        "study.name=prune",
        "workload.slo.ttft_ms=0.001",  # no request can meet it
        "workload.num_requests=60",
        *FAST[1:],
    )
    study_mod.run(cfg)
    t = optuna.load_study(study_name="prune", storage=storage_url(cfg)).trials[0]
    assert t.state == optuna.trial.TrialState.PRUNED
    assert "TTFT SLO" in t.user_attrs["pruned"]
    assert stored_trial.constraints(t)["slo_ttft"] > 0
    done = t.user_attrs["metrics"]["completed"]
    assert 4 <= done < 60, done  # stopped early, with its partial metrics
    children = [
        r for r in mlflow_runs(tmp_path, "prune") if r.data.tags.get("tuner.role") == "trial"
    ]
    assert children[0].data.tags["trial.state"] == "pruned"
    assert children[0].info.status == "KILLED"


def test_repeats_replay_other_streams_on_one_server_and_average(
    make_cfg: Callable[..., TunerConfig],
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    cfg = make_cfg(  # in this process: the CLI is not what is tested
        "+workload=chat",
        "study.n_trials=1",
        "study.name=rep",
        "study.repeats=3",
        "confirm.enabled=false",
        "tracking=none",
        *FAST,
    )
    out = run_study(cfg, capsys, caplog)
    t = optuna.load_study(study_name="rep", storage=storage_url(cfg)).trials[0]
    m = t.user_attrs["metrics"]
    tdir = Path(t.user_attrs["trial_dir"])
    each = json.loads((tdir / "repeats.json").read_text())
    assert [e["repeat"] for e in each] == [1, 2, 3]
    assert m["repeats"] == 3
    for key in ("goodput", "output_throughput", "ttft_p50_ms"):
        assert m[key] == pytest.approx(sum(e[key] for e in each) / 3)
    good = [e["goodput"] for e in each]
    assert m["goodput_spread"] == pytest.approx((max(good) - min(good)) / m["goodput"])
    assert t.values[0] == pytest.approx(m["output_throughput"])  # the objective is the mean
    assert all(e.get("caches_reset") == 1.0 for e in each[1:])  # cold caches for each repeat
    # one server, three different request streams
    assert out.count("launching on GPU") == 1
    streams = [
        [json.loads(line)["output_tokens"] for line in (tdir / sub / "requests.jsonl").open()]
        for sub in ("", "repeat_2", "repeat_3")
    ]
    assert streams[0] != streams[1] != streams[2]
    assert json.loads((tdir / "result.json").read_text())["metrics"]["repeats"] == 3


def test_timeout_stops_asking_but_finishes_and_confirms(
    make_cfg: Callable[..., TunerConfig],
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # a budget shorter than one trial: the first trial runs to its end, no second one starts,
    # the confirm stage still runs, and the same command continues the study (in this process:
    # the CLI is not what is tested)
    args = ["+workload=chat", "study.name=budget", "study.n_trials=4", "study.timeout_s=0.5"]
    args += ["tracking=none", "confirm.picks=[goodput]", "confirm.seeds=[1]", *FAST]
    cfg = make_cfg(*args)
    out = run_study(cfg, capsys, caplog)
    study = optuna.load_study(study_name="budget", storage=storage_url(cfg))
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE]
    assert "study.timeout_s (0.5 s) has passed: no new trial after 1 of 4" in out
    assert ConfirmRecord.from_study(study) is not None
    out = run_study(make_cfg(*args), capsys, caplog)  # continues (a rejected config takes no time)
    # the log counts as study.n_trials does: configs refused before launch are not counted
    stored = optuna.load_study(study_name="budget", storage=storage_url(cfg)).trials
    new = len(counted(stored)) - 1
    assert new >= 1
    if new < 4:
        assert f"no new trial after {new} of 4" in out, out[-2000:]


def test_a_finished_replay_is_kept_when_a_later_one_is_interrupted(tmp_path: Path) -> None:
    # repeats (and the confirm stage's seeds) replay one after another on one server: what the
    # first replay measured is on disk as soon as it ends, not only when the server's last ends
    proc = subprocess.Popen(
        [sys.executable, "-m", "tuner", "+workload=chat", "study.n_trials=1", "study.repeats=2"]
        + ["objective=throughput"]  # repeats of the workload's own replay, as before capacity
        + ["tracking=none", "workload.num_requests=120", "workload.arrival.concurrency=8"]
        + ["engine.env.TUNER_SIM_SPEEDUP=3"],  # each replay still takes seconds
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # repeat 1 has ended, so repeat 2 replays now
            if list(tmp_path.glob("outputs/runs/*/trial_0000/result.json")):
                break
            time.sleep(0.1)
        else:
            pytest.fail("no result of repeat 1")
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 130, out[-2000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    tdir = next(tmp_path.glob("outputs/runs/*/trial_0000"))
    assert not (tdir / "repeat_2" / "result.json").exists()
    first = json.loads((tdir / "result.json").read_text())
    assert first["metrics"]["completed"] == 120
    assert first["values"] and first["values"][0] > 0
    assert len((tdir / "requests.jsonl").read_text().splitlines()) == 120 + 8  # + warm-ups
    state = optuna.load_study(study_name="chat-qwen3-8b-sim", storage=storage(tmp_path)).trials[0]
    assert state.state == optuna.trial.TrialState.FAIL  # the trial itself did not finish


def test_a_study_of_the_full_space_continues_in_the_default_space(
    make_cfg: Callable[..., TunerConfig],
) -> None:
    """The default space stopped searching enforce_eager (space=full still does): a study whose
    stored trials have it, eager ones included, must continue there with TPE past its start-up.
    In this process: the CLI is not what is tested."""
    common = ["+workload=chat", "study.name=s", "tracking=none", "study.n_startup_trials=1", *FAST]
    common.append("confirm.enabled=false")
    cfg = make_cfg(
        *common, "space=full", "study.n_trials=2", "study.enqueue=[{enforce_eager: true}]"
    )
    study_mod.run(cfg)
    stored = optuna.load_study(study_name="s", storage=storage_url(cfg)).trials
    assert [t.params.get("enforce_eager") for t in stored] == [False, True]  # baseline, enqueued
    study_mod.run(make_cfg(*common, "study.n_trials=3"))
    trials = optuna.load_study(study_name="s", storage=storage_url(cfg)).trials
    assert len(counted(trials)) == 5
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    assert all("enforce_eager" not in t.params for t in trials[2:])
    assert all("cudagraph_mode" in t.params for t in trials[2:])  # graphs are searched instead


def test_warm_start_and_grid_sampler(
    make_cfg: Callable[..., TunerConfig],
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # in this process: the CLI is not what is tested
    common = ["+workload=chat", "tracking=none", "confirm.enabled=false", *FAST]
    cfg = make_cfg(*common, "study.n_trials=3", "study.name=src")
    run_study(cfg, capsys, caplog)
    src = optuna.load_study(study_name="src", storage=storage_url(cfg))
    best = {t.number for t in src.best_trials}
    assert best
    out = run_study(
        make_cfg(
            *common,
            "study=grid",
            "study.n_trials=2",
            "study.name=dst",
            "study.warm_start=src",
            "study.baseline_first=false",
        ),
        capsys,
        caplog,
    )
    assert "warm start: enqueued" in out
    dst = optuna.load_study(study_name="dst", storage=storage_url(cfg))
    assert dst.trials[0].params == src.trials[min(best)].params
    with pytest.raises(ConfigError, match="study.warm_start 'nope'"):  # exit 2 from the CLI
        study_mod.run(make_cfg(*common, "study.warm_start=nope", "study.name=x"))
    assert "x" not in optuna.get_all_study_names(storage_url(cfg))  # refused before it was made


def test_kill_9_then_the_same_command_recovers(tmp_path: Path) -> None:
    """The tuner dies mid-trial (SIGKILL: no cleanup at all); the next run of the same command
    stops the server it left, marks the trial failed in Optuna and MLflow, and goes on."""
    mark = f"TUNER_TEST_MARK={uuid.uuid4().hex}"
    env = {**os.environ, mark.split("=")[0]: mark.split("=")[1]}
    # FAST's objective (throughput) for both runs: the same command, the same study; servers
    # started as processes, which outlive the tuner (a forked one does not:
    # test_preload.py's test_kill_9_of_a_preloading_tuner_leaves_no_server_and_the_next_run_recovers)
    args = ["+workload=chat", "study.n_trials=1", "engine.env.TUNER_SIM_SPEEDUP=1"]
    args += ["objective=throughput", "engine.preload=false"]
    kill_9_once_serving(tmp_path, [*args, "workload.num_requests=400"], env)
    time.sleep(0.3)
    left = marked_pids(mark)
    assert len(left) >= 2, "the server (and its EngineCore) outlive a SIGKILLed tuner"
    assert list((tmp_path / "outputs" / "state" / "leases").glob("*.json"))

    marker = {mark.split("=")[0]: mark.split("=")[1]}
    p = tuner(tmp_path, *args, *FAST, "confirm.enabled=false", env=marker)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "recovered: trial 0" in p.stderr + p.stdout
    assert marked_pids(mark) == [], "the leftover server was not stopped"
    assert not list((tmp_path / "outputs" / "state" / "leases").glob("*.json"))
    study = optuna.load_study(study_name="chat-qwen3-8b-sim", storage=storage(tmp_path))
    first, second = study.trials
    assert first.state == optuna.trial.TrialState.FAIL
    assert first.user_attrs["failure_reason"] == "interrupted"
    assert second.state == optuna.trial.TrialState.COMPLETE
    # the killed trial was the baseline: it runs again, vLLM's defaults, before any sampled one
    assert first.user_attrs["baseline"] and second.user_attrs["baseline"]
    assert second.params == first.params
    assert "baseline trial (vLLM's defaults) has not finished yet; enqueued again" in p.stdout
    runs = mlflow_runs(tmp_path, "chat-qwen3-8b-sim")
    parents = sorted(
        (r for r in runs if r.data.tags.get("tuner.role") == "study"),
        key=lambda r: r.info.start_time,
    )
    assert [r.info.status for r in parents] == ["KILLED", "FINISHED"]
    assert "no longer runs" in parents[0].data.tags["killed_reason"]
    interrupted = [r for r in runs if r.data.tags.get("failure_reason") == "interrupted"]
    assert len(interrupted) == 1 and interrupted[0].info.status == "FAILED"
    assert interrupted[0].data.tags["mlflow.parentRunId"] == parents[0].info.run_id


def test_kill_9_in_the_confirm_stage_then_the_next_run_closes_its_mlflow_run(
    tmp_path: Path,
) -> None:
    """The tuner dies while it confirms (no trial running, so no trial to fail): the next run of
    the study ends the parent run the dead one left RUNNING, KILLED with the reason, and stops
    the confirm server it left."""
    mark = f"TUNER_TEST_MARK={uuid.uuid4().hex}"
    marker = {mark.split("=")[0]: mark.split("=")[1]}
    args = ["+workload=chat", *FAST]
    pid = kill_9_when(
        tmp_path,
        [*args, "study.n_trials=1"],
        {**os.environ, **marker},
        lambda: bool(list(tmp_path.glob("outputs/runs/*/confirm/trial_*/round_1"))),
        "the confirm stage did not start",
        timeout=120,
    )
    (dead,) = [r for r in mlflow_runs(tmp_path, "chat-qwen3-8b-sim") if r.info.status == "RUNNING"]

    p = tuner(tmp_path, *args, "study.n_trials=0", "confirm.enabled=false", env=marker)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "recovered: MLflow study run" in p.stdout + p.stderr
    assert marked_pids(mark) == [], "the confirm server the dead tuner left was not stopped"
    runs = {r.info.run_id: r for r in mlflow_runs(tmp_path, "chat-qwen3-8b-sim")}
    assert runs[dead.info.run_id].info.status == "KILLED"
    assert f":{pid}) no longer runs" in runs[dead.info.run_id].data.tags["killed_reason"]
    assert [r.info.status for r in runs.values()].count("RUNNING") == 0
    trials = optuna.load_study(study_name="chat-qwen3-8b-sim", storage=storage(tmp_path)).trials
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE]  # confirmed, not failed


def test_parallel_workers_lease_disjoint_gpus(tmp_path: Path) -> None:
    p = tuner(
        tmp_path,
        "+workload=chat",
        "study.n_trials=6",
        "study.n_workers=2",
        "engine.gpus=[0,1]",
        "engine.cpu_pinning=true",
        "engine.cpu_reserve=0",  # this machine's cores, one per GPU's server
        "tracking=none",
        "confirm.enabled=false",
        # every trial launches (vLLM's defaults): sampled configs that the precheck rejects in
        # no time could leave one worker launching alone (seen once on a loaded machine)
        "space=none",
        *FAST[:-1],
        "engine.env.TUNER_SIM_SPEEDUP=5",
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert "(CPUs " in p.stdout  # each launch names the cores it is pinned to
    results = [
        json.loads(f.read_text())
        for f in (tmp_path / "outputs" / "runs").glob("*/trial_*/result.json")
    ]
    assert len(results) == 6
    launched = [r for r in results if r["launched"]]
    assert len(launched) == 6
    assert all(len(r["gpus"]) == 1 for r in launched)
    spans = [(r["started_at"], r["started_at"] + r["duration_s"], r["gpus"]) for r in launched]
    overlapping = 0
    for i, (a0, a1, ga) in enumerate(spans):
        for b0, b1, gb in spans[i + 1 :]:
            if a0 < b1 and b0 < a1:  # ran at the same time: never on the same GPU
                overlapping += 1
                assert set(ga).isdisjoint(gb), (ga, gb)
    assert overlapping >= 1, "two workers never ran at once"
    measured = [r for r in launched if "co_running_gpus" in r["metrics"]]
    assert measured and all(r["metrics"]["cpus_pinned"] >= 1 for r in measured)
    assert any(r["metrics"]["co_running_gpus"] == 1.0 for r in measured)  # interference record
    study = optuna.load_study(study_name="chat-qwen3-8b-sim", storage=storage(tmp_path))
    assert sorted(t.number for t in study.trials) == list(range(6))


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores")
def test_cpu_pinning_keeps_the_tuner_on_its_reserved_cores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cores = sorted(os.sched_getaffinity(0))
    p = tuner(
        tmp_path,
        "+workload=chat",
        "study.n_trials=2",
        "engine.cpu_pinning=true",
        "engine.cpu_reserve=1",
        "workload.client_processes=2",  # more client processes than reserved cores: a warning
        "tracking=none",
        "confirm.enabled=false",
        "space=none",
        *FAST,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    out = " ".join((p.stdout + p.stderr).split())
    assert f"engine.cpu_pinning: the tuner and its replay client on {cores[0]};" in out
    assert "workload.client_processes=2 shares engine.cpu_reserve=1 cores" in out
    _, plan, _ = main_in_process(
        tmp_path,
        "+workload=chat",
        "dry_run=true",
        "engine.cpu_pinning=true",
        "engine.cpu_reserve=1",
        monkeypatch=monkeypatch,
        capsys=capsys,
    )
    rest = f"{cores[1]}-{cores[-1]}" if len(cores) > 2 else str(cores[1])
    assert (
        f"CPU cores: the tuner and its replay client on {cores[0]}; servers: GPU 0 on {rest}"
        in " ".join(plan.split())
    )
    results = [
        json.loads(f.read_text())
        for f in (tmp_path / "outputs" / "runs").glob("*/trial_*/result.json")
    ]
    launched = [r for r in results if r["launched"]]
    assert launched
    for r in launched:  # the server on the other cores, the client on the reserved one
        assert r["metrics"]["cpus_pinned"] == len(cores) - 1
        assert r["metrics"]["client_cpus"] == 1.0


@pytest.mark.fast
def test_a_study_continued_with_other_choices_is_one_line(
    make_cfg: Callable[..., TunerConfig],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A stored search study continued after a categorical's choices changed: exit 2 with one
    line, not Optuna's traceback at the first ask ("CategoricalDistribution does not support
    dynamic value space"), and nothing more stored."""
    state = f"paths.state_dir={tmp_path / 'state'}"
    first = make_cfg("+workload=chat", state)
    study = open_study(first)  # the study as a run of one trial left it
    study.tell(study.ask(distributions(first.space)), [1.0, 1.0])
    args = ["+workload=chat", state, "space.params.kv_cache_dtype.choices=[auto,fp8,fp8_e5m2]"]
    code, out, err = main_in_process(tmp_path, *args, monkeypatch=monkeypatch, capsys=capsys)
    assert code == 2 and "Traceback" not in out + err, err[-3000:]
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert "stores kv_cache_dtype with choices ['auto', 'fp8']; this run's are" in err
    assert "space.params.kv_cache_dtype.choices=[auto,fp8]" in err and "study.name" in err
    assert (
        len(optuna.load_study(study_name=study.study_name, storage=storage_url(first)).trials) == 1
    )
    assert not (tmp_path / "outputs").exists(), "no run folder"


@pytest.mark.fast
def test_more_workers_than_gpus_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["+workload=chat", "study.n_workers=3", "engine.gpus=[0,1]"]
    code, _, err = main_in_process(tmp_path, *args, monkeypatch=monkeypatch, capsys=capsys)
    assert code == 2 and "study.n_workers is 3; allowed: 1 to 2" in err


@pytest.mark.fast
def test_dry_run_prints_the_plan_and_launches_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["+workload=chat", "engine=vllm", "dry_run=true"]
    code, stdout, stderr = main_in_process(tmp_path, *args, monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, stderr[-2000:]
    out = " ".join(stdout.split())  # rich wraps long lines
    assert "study chat-qwen3-8b-vllm-capacity · engine vllm" in out
    assert (
        "objective: capacity_rps (max), ttft_p95_ms (min); SLO capacity: the highest load with "
        "TTFT <= 2000 ms, TPOT <= 50 ms at p95, searched on each trial's server after its own "
        "replay (at most 8 replays, to 5%); once the study has a capacity, the incumbent's load "
        "first" in out
    )
    # the baseline passes no searched flag; it once printed every flag at vLLM's default
    assert "baseline trial (vLLM's defaults, no searched flag passed): vllm serve " in out
    assert (
        "/models/qwen3-8b-dummy --host 127.0.0.1 --port <free port> --served-model-name m "
        "--load-format dummy searched trials: the same plus their value of "
        "--block-size --max-num-batched-tokens -cc.cudagraph_mode --kv-cache-dtype "
        "--quantization" in out
    )
    assert (
        "then confirm capacity, latency, knee, baseline at 2x load, 1x duration, seeds [1], "
        "3 round(s) (a fresh server per pick per round: up to 12 server starts)" in out
    )
    assert not (tmp_path / "outputs" / "state" / "optuna.db").exists()
    assert not list(tmp_path.glob("outputs/runs/*/trial_*"))
    assert "prescreen" not in out  # off by default
    assert "do not count toward study.n_trials (at most study.max_rejected=50 per run)" in out
    # the default space has no infeasible corner left (conf/space/default.yaml): nothing refused
    assert "precheck: refuses 0% of 1000 random configs from this space" in out
    assert "study created in memory" not in stdout + stderr  # its Optuna study is quiet
    # workload.client_processes=auto (tests/unit/test_client_choice.py has the rule's figures)
    assert "replay client on asyncio: " in out and " (auto)" in out
    assert "64 requests in flight" in out
    assert "closed loop, 64 requests in flight" in out
    assert "auto chooses again for each replay's own load" in out
    n = len(os.sched_getaffinity(0))
    assert f"CPU cores: not pinned; servers, the tuner and its replay client share {n} cores" in out


def test_dry_run_notes_a_client_with_too_many_streams(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["+workload=chat", "dry_run=true", "workload.arrival.concurrency=1000"]

    def plan(processes: str) -> str:
        code, stdout, stderr = main_in_process(
            tmp_path, *args, processes, monkeypatch=monkeypatch, capsys=capsys
        )
        assert code == 0, stderr[-2000:]
        return " ".join(stdout.split())

    out = plan("workload.client_processes=1")
    assert (  # 1,000 slots, but only the 300 requests of the workload to fill them
        "replay client on asyncio: 1 process, the tuner's own (workload.client_processes=1), "
        "300 requests in flight" in out
    )
    assert "note: 300 streams in the tuner's own process: the client adds latency" in out
    assert "auto would take 19 processes given the cores" in out
    out = plan("workload.client_processes=2")
    assert (
        "2 processes (workload.client_processes=2), 300 requests in flight (150 per process)" in out
    )


def test_dry_run_names_the_prescreen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["+workload=chat", "objective=goodput", "dry_run=true", "study.prescreen.trials=50"]
    code, stdout, stderr = main_in_process(tmp_path, *args, monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, stderr[-2000:]
    out = " ".join(stdout.split())
    assert "first: prescreen 50 configs on the simulator's landscape, then launch its best 3" in out
    assert not (tmp_path / "outputs" / "state" / "optuna.db").exists()


def test_a_grid_study_stops_when_every_cell_has_run(
    make_cfg: Callable[..., TunerConfig],
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """study=grid with more trials than cells: every cell measured, then no new trial (Optuna's
    grid sampler would run random cells again); the baseline's run counts for the defaults'."""
    cfg = make_cfg(
        "+workload=chat", "tracking=none", "confirm.enabled=false", *FAST, "study.name=g",
        "space=levers", "space.params.disable_cascade_attn.enabled=false", "study=grid",
        "study.n_trials=20",
    )  # fmt: skip
    out = run_study(cfg, capsys, caplog)
    assert "every cell of the grid has run; no new trial" in out
    trials = optuna.load_study(study_name="g", storage=storage_url(cfg)).trials
    cells = {(t.params["quantization"], t.params["stream_interval"]) for t in trials}
    assert cells == {(None, None), ("fp8", None), (None, 8), ("fp8", 8)}
    assert 4 <= len(trials) <= 5  # the defaults twice at most: the baseline, and their cell
    assert trials[0].user_attrs["baseline"]
