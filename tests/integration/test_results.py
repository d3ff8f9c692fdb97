"""After the search: the confirm stage, the exports, the figures, the MLflow tags, and
``python -m tuner report`` regenerating them from storage alone."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import optuna
import pytest
import yaml

from .test_study import FAST, mlflow_runs, storage, tuner
from .trials import counted

pytestmark = pytest.mark.integration


def test_confirm_export_and_report_from_storage(tmp_path: Path) -> None:
    p = tuner(
        tmp_path,
        "+workload=chat",
        "study.n_trials=4",
        "study.name=res",
        *FAST,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert "Confirm: the picks under stress" in p.stdout
    assert "Recommended: trial" in p.stdout
    assert "ETA" in p.stdout  # the per-trial progress line (Hydra logs to stdout)
    (run_dir,) = [
        d for d in (tmp_path / "outputs" / "runs").iterdir() if (d / "pareto.json").exists()
    ]

    study = optuna.load_study(study_name="res", storage=storage(tmp_path))
    confirm = study.user_attrs["confirm"]
    assert confirm["seeds"] == [1, 2] and confirm["load_factor"] == 2.0
    picked = {p for c in confirm["candidates"] for p in c["picks"]}
    assert picked == {"goodput", "latency", "knee"}
    for r in confirm["results"]:
        assert [run["seed"] for run in r["runs"]] == [1, 2]
        for seed in (1, 2):  # 3x the requests (12 -> 36 measured) on a server of its own
            rows = (
                run_dir / "confirm" / f"trial_{r['trial']:04d}" / f"seed_{seed}" / "requests.jsonl"
            )
            measured = [json.loads(x) for x in rows.read_text().splitlines()]
            assert sum(not x["warmup"] for x in measured) == 36
            result = json.loads(rows.with_name("result.json").read_text())
            assert result["metrics"].get("caches_reset") == (None if seed == 1 else 1.0)
    assert study.user_attrs["recommended_trial"] in {c["trial"] for c in confirm["candidates"]}

    for name in ("goodput", "latency", "knee"):
        exported = yaml.safe_load((run_dir / f"best-{name}.yaml").read_text())
        assert exported["model"].endswith("qwen3-8b-dummy")
        assert exported["load-format"] == "dummy"
        assert not {"host", "port", "served-model-name"} & set(exported)
        assert "exec vllm serve " in (run_dir / f"best-{name}.sh").read_text()
    for fig in ("pareto.html", "parallel_coordinates.html", "importances.html", "latency_cdf.html"):
        assert (run_dir / fig).stat().st_size > 1000, fig

    runs = mlflow_runs(tmp_path, "res")
    (parent,) = [r for r in runs if r.data.tags.get("tuner.role") == "study"]
    assert parent.data.tags["tuner.recommended_trial"] == str(study.user_attrs["recommended_trial"])
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    logged = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"best-goodput.yaml", "pareto.html", "confirm.json", "latency_cdf.html"} <= logged

    # another machine (or a deleted run dir): the report rebuilds it all from the storage and
    # MLflow, running nothing
    shutil.rmtree(run_dir)
    r = tuner(tmp_path, "report", "study.name=res", "hydra.run.dir=report")
    assert r.returncode == 0, r.stderr[-3000:]
    out = tmp_path / "report"
    assert (out / "best-goodput.yaml").read_text().count("confirmed under 2x load") == 1
    cdf = (out / "latency_cdf.csv").read_text().splitlines()
    assert len(cdf) > 10  # trial folders came back from MLflow
    assert f"downloaded {len(study.trials)} trial folder(s) from MLflow" in r.stdout
    reports = [r for r in mlflow_runs(tmp_path, "res") if r.data.tags.get("tuner.role") == "report"]
    assert len(reports) == 1
    assert (
        reports[0].data.tags["tuner.recommended_trial"]
        == parent.data.tags["tuner.recommended_trial"]
    )
    stored = optuna.load_study(study_name="res", storage=storage(tmp_path)).trials
    assert len(stored) == len(study.trials) and len(counted(stored)) == 4  # the report ran none


def test_report_names_what_is_wrong(tmp_path: Path) -> None:
    r = tuner(tmp_path, "report")
    assert r.returncode == 2 and r.stderr.strip().startswith("error: report needs the study")
    r = tuner(tmp_path, "report", "study.name=nope")
    assert r.returncode == 2 and "no Optuna storage" in r.stderr
    assert "Traceback" not in r.stderr


def test_confirm_off_still_exports_unconfirmed(tmp_path: Path) -> None:
    p = tuner(
        tmp_path,
        "+workload=chat",
        "study.n_trials=3",
        "study.name=off",
        "tracking=none",
        "confirm.enabled=false",
        "confirm.picks=[throughput]",
        *FAST,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    (run_dir,) = [
        d for d in (tmp_path / "outputs" / "runs").iterdir() if (d / "pareto.json").exists()
    ]
    assert not (run_dir / "confirm").exists()
    assert "not stress-tested" in (run_dir / "best-throughput.yaml").read_text()
    assert not (run_dir / "best-goodput.yaml").exists()


def test_a_resumed_study_does_not_stress_a_trial_twice(tmp_path: Path) -> None:
    args = ["+workload=chat", "study.name=again", "tracking=none", *FAST]
    first = tuner(tmp_path, *args, "study.n_trials=3")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "confirm 1/" in first.stdout
    again = tuner(tmp_path, *args, "study.n_trials=0")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "confirm: reusing the stored verdicts of trials" in again.stdout
    assert "confirm 1/" not in again.stdout  # nothing new to stress
    assert "Recommended: trial" in again.stdout
    # more trials without the confirm stage: picked again; verdicts kept only for the same trials
    more = tuner(tmp_path, *args, "study.n_trials=2", "confirm.enabled=false")
    assert more.returncode == 0, more.stderr[-3000:]
    runs = sorted((tmp_path / "outputs" / "runs").glob("*/best-goodput.yaml"))
    headers = [p.read_text().splitlines()[2] for p in runs[-1].parent.glob("best-*.yaml")]
    assert headers and all(
        h.startswith(("# confirmed under", "# not stress-tested", "# DEMOTED")) for h in headers
    ), headers
