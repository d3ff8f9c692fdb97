"""Two tuner processes share one study through PostgreSQL (Optuna storage and MLflow store).

Needs a PostgreSQL server: `.ci/run` installs and starts one (Debian's package) and sets
TUNER_TEST_POSTGRES (Optuna database URL) and TUNER_TEST_POSTGRES_MLFLOW (MLflow database URL).
Elsewhere the test is skipped, unless TUNER_REQUIRE_POSTGRES=1 makes that a failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
from helpers.trials import counted

from tuner import stored_trial
from tuner.config import TunerConfig
from tuner.space import defaults

pytestmark = pytest.mark.integration

URL = os.environ.get("TUNER_TEST_POSTGRES")
MLFLOW_URL = os.environ.get("TUNER_TEST_POSTGRES_MLFLOW")
if not (URL and MLFLOW_URL):
    if os.environ.get("TUNER_REQUIRE_POSTGRES") == "1":
        raise RuntimeError("TUNER_REQUIRE_POSTGRES=1 but TUNER_TEST_POSTGRES(_MLFLOW) is unset")
    pytest.skip(
        "no PostgreSQL (set TUNER_TEST_POSTGRES and TUNER_TEST_POSTGRES_MLFLOW)",
        allow_module_level=True,
    )


def test_two_workers_share_one_study(tmp_path: Path, make_cfg: Callable[..., TunerConfig]) -> None:
    name = f"pg-{uuid.uuid4().hex[:8]}"
    args = [
        sys.executable,
        "-m",
        "tuner",
        "+workload=chat",
        "objective=throughput",  # one replay a trial: the workers' sharing is what is tested
        "study.n_trials=6",
        f"study.name={name}",
        f"study.storage={URL}",
        f"tracking.uri={MLFLOW_URL}",
        "workload.num_requests=10",
        "workload.warmup_requests=0",
        "workload.arrival.concurrency=5",
        "workload.output_tokens.low=8",
        "workload.output_tokens.high=16",
        "engine.env.TUNER_SIM_SPEEDUP=20",
        "confirm.rounds=1",  # one fresh server per candidate: enough to see who confirms
        # 4 configs (KV and weight dtypes): most studies also draw vLLM's defaults, a baseline
        # trial that neither worker enqueued (before, 1 point of 192: a draw there failed a
        # fresh-clone CI run on 2026-12-07, which counted it as a second enqueued baseline)
        "space.params.block_size.enabled=false",
        "space.params.max_num_batched_tokens.enabled=false",
        "space.params.cudagraph_mode.enabled=false",
    ]
    procs = []
    for i in range(2):  # two workers, each in its own directory (own run dir and state)
        cwd = tmp_path / f"w{i}"
        cwd.mkdir()
        procs.append(
            subprocess.Popen(
                args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
        time.sleep(1.0)
    outs = [p.communicate(timeout=300)[0] for p in procs]
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, out[-3000:]

    study = optuna.load_study(study_name=name, storage=URL)
    numbers = [t.number for t in study.trials]
    assert sorted(numbers) == list(range(len(numbers))), numbers  # none lost, none duplicated
    assert len(counted(study.trials)) == 12
    # every trial told by the worker that ran it: none left RUNNING, WAITING or FAIL. PRUNED is
    # a told trial too: a drawn config whose replay lost its SLO beyond doubt (a fresh-clone CI
    # run, 2026-12-03: `--gpu-memory-utilization 0.105 --max-num-seqs 29` with fp8, TPOT over
    # 50 ms on 2 of 10 requests at speed-up 20 on busy cores)
    told = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    assert all(t.state in told for t in study.trials), [(t.number, t.state) for t in study.trials]
    workers = {t.user_attrs["worker"] for t in study.trials}
    assert len(workers) == 2  # both processes ran trials
    # vLLM's defaults enqueued once (the prepare lock: Optuna keeps an enqueued trial's params as
    # fixed_params); a draw at them is a baseline trial too, flagged by the worker that drew it
    bases = [t for t in study.trials if stored_trial.is_baseline(t)]
    assert sum("fixed_params" in t.system_attrs for t in bases) == 1, [
        (t.number, t.params, t.system_attrs) for t in bases
    ]
    at_defaults = defaults(make_cfg(*args[3:]).space)  # the searched params' vLLM defaults
    assert [t.number for t in study.trials if t.params == at_defaults] == [t.number for t in bases]

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=MLFLOW_URL)
    exp = client.get_experiment_by_name(name)
    assert exp is not None
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    trials = [r for r in runs if r.data.tags.get("tuner.role") == "trial"]
    parents = [r for r in runs if r.data.tags.get("tuner.role") == "study"]
    assert len(parents) == 2 and len(trials) == len(numbers)
    assert sorted(int(r.data.tags["trial.number"]) for r in trials) == list(range(len(numbers)))

    # the report rebuilds exports and figures from the PostgreSQL storage, running nothing
    r = subprocess.run(
        [sys.executable, "-m", "tuner", "report", f"study.name={name}", f"study.storage={URL}"]
        + [f"tracking.uri={MLFLOW_URL}", "objective=throughput", "hydra.run.dir=report"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"Study {name}: {len(numbers)} trials" in r.stdout
    assert (tmp_path / "report" / "best-goodput.yaml").is_file()
    assert (tmp_path / "report" / "pareto.html").is_file()
    # one worker confirmed (the one that finished last); the other saw it still running or done
    confirmed = [o for o in outs if "Confirm: the picks under stress" in o]
    assert 1 <= len(confirmed) <= 2
    assert len(optuna.load_study(study_name=name, storage=URL).trials) == len(numbers)

    # the URLs' passwords: neither printed nor in any file (run dirs, .hydra/, logs, leases,
    # the report), only the URLs with ``***`` (by their place: CI's password is "tuner")
    from sqlalchemy.engine import make_url

    for url in (URL, MLFLOW_URL):
        cred = f"{make_url(url).username}:{make_url(url).password}@"
        assert all(cred not in o for o in [*outs, r.stdout, r.stderr])
        for f in (p for p in tmp_path.rglob("*") if p.is_file()):
            assert cred.encode() not in f.read_bytes(), f
    overrides = next(tmp_path.glob("w0/outputs/runs/*/.hydra/overrides.yaml")).read_text()
    assert ":***@127.0.0.1" in overrides
