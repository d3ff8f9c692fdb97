"""After the search: the confirm stage, the exports, the figures, the MLflow tags, and
``python -m tuner report`` regenerating them from storage alone."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
import yaml
from helpers import reference
from helpers.cli import FAST, main_in_process, mlflow_client, mlflow_runs, storage, tuner
from helpers.reference import Reference
from helpers.trials import counted

import tuner.study as study_mod
from tuner import stored_trial
from tuner.config import TunerConfig
from tuner.stored_study import ConfirmRecord, recommended_trial
from tuner.verdict import VERDICTS

pytestmark = pytest.mark.integration


@pytest.mark.fast
def test_confirm_and_export(reference_study: Reference) -> None:
    cwd, stdout = reference_study.cwd, reference_study.stdout
    assert "Confirm: the picks under stress" in stdout
    assert "Verdict: " in stdout
    assert "Recommended: trial" in stdout
    assert "ETA" in stdout  # the per-trial progress line (Hydra logs to stdout)
    run_dir = reference_study.run_dir

    study = optuna.load_study(study_name=reference.STUDY, storage=storage(cwd))
    confirm = ConfirmRecord.from_study(study)
    assert confirm is not None and confirm.verdict is not None
    assert confirm.seeds == (1, 2) and confirm.load_factor == 2.0
    assert confirm.rounds == 2 and confirm.verdict.kind in VERDICTS
    picked = {p for c in confirm.candidates for p in c.picks}
    assert picked == {"goodput", "latency", "knee", "baseline"}
    for r in confirm.results:
        assert [(run["round"], run["seed"]) for run in r.runs] == [
            (1, 1),
            (1, 2),
            (2, 1),
            (2, 2),
        ]
        for rnd, seed in ((1, 1), (1, 2), (2, 1), (2, 2)):  # 2x the requests (12 -> 24 measured)
            tdir = run_dir / "confirm" / f"trial_{r.trial:04d}" / f"round_{rnd}"
            rows = tdir / f"seed_{seed}" / "requests.jsonl"
            measured = [json.loads(x) for x in rows.read_text().splitlines()]
            assert sum(not x["warmup"] for x in measured) == 24
            result = json.loads(rows.with_name("result.json").read_text())
            # each round on a fresh server: its first run starts with clean caches
            assert result["metrics"].get("caches_reset") == (None if seed == 1 else 1.0)
            assert (tdir / "server.log").is_file()
    assert recommended_trial(study) in {c.trial for c in confirm.candidates}

    for name in ("goodput", "latency", "knee"):
        exported = yaml.safe_load((run_dir / f"best-{name}.yaml").read_text())
        assert exported["model"].endswith("qwen3-8b-dummy")
        assert exported["load-format"] == "dummy"
        assert not {"host", "port", "served-model-name"} & set(exported)
        assert "exec vllm serve " in (run_dir / f"best-{name}.sh").read_text()
    for fig in ("pareto.html", "parallel_coordinates.html", "importances.html", "latency_cdf.html"):
        assert (run_dir / fig).stat().st_size > 1000, fig

    runs = mlflow_runs(cwd, reference.STUDY)
    (parent,) = [r for r in runs if r.data.tags.get("tuner.role") == "study"]
    assert parent.data.tags["tuner.recommended_trial"] == str(recommended_trial(study))
    assert parent.data.tags["tuner.verdict"] == confirm.verdict.kind
    logged = {a.path for a in mlflow_client(cwd).list_artifacts(parent.info.run_id)}
    assert {"best-goodput.yaml", "pareto.html", "confirm.json", "latency_cdf.html"} <= logged


def test_report_rebuilds_it_all_from_storage(reference_study: Reference, tmp_path: Path) -> None:
    # another machine (or a deleted run dir): the report rebuilds it all from the storage and
    # MLflow, running nothing
    cwd = reference_study.copy(tmp_path / "study")
    study = optuna.load_study(study_name=reference.STUDY, storage=storage(cwd))
    (parent,) = [
        r for r in mlflow_runs(cwd, reference.STUDY) if r.data.tags.get("tuner.role") == "study"
    ]
    shutil.rmtree(cwd / "outputs" / "runs" / reference_study.run_dir.name)
    r = tuner(
        cwd,
        "report",
        f"study.name={reference.STUDY}",
        "objective=throughput",
        "hydra.run.dir=report",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = cwd / "report"
    assert (out / "best-goodput.yaml").read_text().count("confirmed under 2x load") == 1
    verdict_line = next(x for x in reference_study.stdout.splitlines() if x.startswith("Verdict: "))
    assert verdict_line in r.stdout  # the stored verdict, printed the same
    cdf = (out / "latency_cdf.csv").read_text().splitlines()
    assert len(cdf) > 10  # trial folders came back from MLflow
    assert f"downloaded {len(study.trials)} trial folder(s) from MLflow" in r.stdout
    reports = [
        r for r in mlflow_runs(cwd, reference.STUDY) if r.data.tags.get("tuner.role") == "report"
    ]
    assert len(reports) == 1
    assert (
        reports[0].data.tags["tuner.recommended_trial"]
        == parent.data.tags["tuner.recommended_trial"]
    )
    stored = optuna.load_study(study_name=reference.STUDY, storage=storage(cwd)).trials
    assert len(stored) == len(study.trials) and len(counted(stored)) == 4  # the report ran none


@pytest.mark.fast
def test_report_names_what_is_wrong(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = main_in_process(tmp_path, "report", monkeypatch=monkeypatch, capsys=capsys)
    assert code == 2 and err.strip().startswith("error: report needs the study")
    code, _, err = main_in_process(
        tmp_path, "report", "study.name=nope", monkeypatch=monkeypatch, capsys=capsys
    )
    assert code == 2 and "no Optuna storage" in err
    assert "Traceback" not in err


def test_confirm_off_still_exports_unconfirmed(make_cfg: Callable[..., TunerConfig]) -> None:
    cfg = make_cfg(  # in this process: the CLI is not what is tested
        "+workload=chat",
        "study.n_trials=3",
        "study.name=off",
        "tracking=none",
        "confirm.enabled=false",
        "confirm.picks=[throughput]",
        *FAST,
    )
    study_mod.run(cfg)
    run_dir = Path(cfg.paths.output_dir)
    assert (run_dir / "pareto.json").exists()
    assert not (run_dir / "confirm").exists()
    assert "not stress-tested" in (run_dir / "best-throughput.yaml").read_text()
    assert not (run_dir / "best-goodput.yaml").exists()


def test_a_resumed_study_does_not_stress_a_trial_twice(
    reference_study: Reference, tmp_path: Path
) -> None:
    # the reference study has confirmed its picks in two rounds; the same command continues it
    # (tests/integration/test_study.py::test_a_study_records_everything reads the first run)
    cwd = reference_study.copy(tmp_path / "study")
    args, env = reference.ARGS, reference.ENV
    assert "confirm 1/" in reference_study.stdout
    again = tuner(cwd, *args, "study.n_trials=0", env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "confirm: reusing the stored verdicts of trials" in again.stdout
    assert "confirm 1/" not in again.stdout  # nothing new to stress
    assert "Recommended: trial" in again.stdout
    verdict = next(x for x in reference_study.stdout.splitlines() if x.startswith("Verdict: "))
    assert verdict in again.stdout
    # other rounds: the stored verdicts do not count
    other = tuner(cwd, *args, "study.n_trials=0", "confirm.rounds=1", env=env)
    assert other.returncode == 0, other.stderr[-3000:]
    assert "confirm: reusing" not in other.stdout and "confirm 1/" in other.stdout
    # more trials without the confirm stage: picked again; verdicts kept only for the same trials
    more = tuner(cwd, *args, "study.n_trials=2", "confirm.enabled=false", env=env)
    assert more.returncode == 0, more.stderr[-3000:]
    # each run of the command continued the one study: its trials added, the baseline not run
    # again, an MLflow study run of its own
    study = optuna.load_study(study_name=reference.STUDY, storage=storage(cwd))
    assert len(counted(study.trials)) == 4 + 2
    assert sum(stored_trial.is_baseline(t) for t in study.trials) == 1
    parents = [
        r for r in mlflow_runs(cwd, reference.STUDY) if r.data.tags.get("tuner.role") == "study"
    ]
    assert len(parents) == 4  # the reference, again, other, more
    runs = sorted((cwd / "outputs" / "runs").glob("*/best-goodput.yaml"))
    headers = [p.read_text().splitlines()[2] for p in runs[-1].parent.glob("best-*.yaml")]
    assert headers and all(
        h.startswith(("# confirmed under", "# not stress-tested", "# DEMOTED")) for h in headers
    ), headers


@pytest.mark.fast
def test_confirm_rounds_give_the_verdict_an_interval(reference_study: Reference) -> None:
    # whatever is picked (the baseline's trial too, or alone), the baseline is confirmed beside
    # the picks; the reference study confirms in two rounds
    cwd, stdout = reference_study.cwd, reference_study.stdout
    study = optuna.load_study(study_name=reference.STUDY, storage=storage(cwd))
    confirm = ConfirmRecord.from_study(study)
    assert confirm is not None and confirm.verdict is not None
    base = next(t.number for t in study.trials if stored_trial.is_baseline(t))
    results = {r.trial: r for r in confirm.results}
    assert base in results and "baseline" in results[base].picks
    for r in results.values():
        assert sorted({run["round"] for run in r.runs}) == [1, 2]
    verdict = confirm.verdict
    assert verdict.baseline == base and verdict.metric == "output_throughput"
    (parent,) = [
        r for r in mlflow_runs(cwd, reference.STUDY) if r.data.tags.get("tuner.role") == "study"
    ]
    assert parent.data.tags["tuner.verdict"] == verdict.kind
    assert parent.data.tags["tuner.verdict_metric"] == "output_throughput"
    assert "Verdict: " in stdout
    shown = verdict.gain
    if shown is not None and shown.low is not None:  # a pick other than the defaults
        metrics = parent.data.metrics
        assert metrics["gain_ci_low"] == pytest.approx(shown.low)
        assert metrics["gain_ci_high"] == pytest.approx(shown.high)
        assert metrics["gain_ci_low"] <= metrics["gain"] <= metrics["gain_ci_high"]
        assert "95 % CI" in stdout and "2 rounds each" in stdout
    else:
        assert "gain_ci_low" not in parent.data.metrics
    if not verdict.gains:  # every pick is the defaults' trial: nothing to compare
        assert verdict.kind == "no_gain" and verdict.recommended == base
    if verdict.recommended is not None:
        assert recommended_trial(study) == verdict.recommended
