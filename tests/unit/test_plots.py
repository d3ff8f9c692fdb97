"""tuner.plots: the data frames behind each figure, the figures themselves, and write_figures."""

from __future__ import annotations

import json
import logging
import math
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pandas as pd
import plotly.graph_objects as go
import pytest
from helpers import chromium
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState, create_trial
from plotly.offline import get_plotlyjs

from tuner import plots, stored_trial
from tuner.plots import write as plots_write

OBJECTIVES = [("output_throughput", "maximize"), ("ttft_p95_ms", "minimize")]
DISTS = {"x": FloatDistribution(0.0, 1.0), "mode": CategoricalDistribution(["a", "b"])}
CONSTRAINT_NAMES = ("failed_cuda_oom", "failed_invalid_config", "slo_ttft")


def _add(
    study: optuna.Study,
    values: list[float] | None,
    x: float,
    *,
    state: TrialState = TrialState.COMPLETE,
    user_attrs: dict[str, Any] | None = None,
    per_name: bool = False,
    **violated: float,
) -> None:
    """A trial with the constraints of CONSTRAINT_NAMES (-0.5 unless ``violated``) stored as
    the tuner stores them, or (``per_name``) in Optuna's per-name keys, as studies stored before
    hold them."""
    system: dict[str, Any] = {}
    user = dict(user_attrs or {})
    if state == TrialState.COMPLETE:
        constraints = {name: violated.get(name, -0.5) for name in CONSTRAINT_NAMES}
        if per_name:
            system = {f"constraints:{k}": v for k, v in constraints.items()}
        else:
            system, names = stored_trial.constraint_attrs(constraints)
            user |= names
    study.add_trial(
        create_trial(
            state=state,
            values=values,
            params={"x": x, "mode": "a" if x < 0.5 else "b"},
            distributions=DISTS,
            user_attrs=user,
            system_attrs=system,
        )
    )


def _new_study() -> optuna.Study:
    study = optuna.create_study(directions=["maximize", "minimize"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names([m for m, _ in OBJECTIVES])
    return study


# trial -> status the tuner expects; values chosen so that the infeasible trial 4 would dominate
# every other one if the constraints were ignored
EXPECTED = {
    0: "pareto",  # baseline, on the front
    1: "pareto",
    2: "pareto",
    3: "feasible",  # dominated by 0
    4: "infeasible",
    5: "failed",
    6: "pruned",
    7: "failed",
    8: "failed",  # state FAIL (interrupted)
    9: "running",
}


@pytest.fixture
def study() -> optuna.Study:
    s = _new_study()
    _add(s, [100.0, 50.0], 0.9, user_attrs={"baseline": True})
    _add(s, [150.0, 80.0], 0.6)
    _add(s, [200.0, 120.0], 0.7)
    _add(s, [90.0, 60.0], 0.2)
    _add(s, [300.0, 40.0], 0.8, slo_ttft=0.5)
    _add(s, [0.0, 1e7], 0.95, user_attrs={"failure_reason": "cuda_oom"}, failed_cuda_oom=1.0)
    _add(s, None, 0.3, state=TrialState.PRUNED, user_attrs={"pruned": "slo_ttft lost"})
    _add(
        s,
        [0.0, 1e7],
        0.1,
        user_attrs={"failure_reason": "invalid_config"},
        failed_invalid_config=1.0,
    )
    _add(s, None, 0.4, state=TrialState.FAIL)
    _add(s, None, 0.5, state=TrialState.RUNNING)
    return s


# --- trial points ---------------------------------------------------------------------------


def test_constraints_are_stored_as_optuna_and_its_dashboard_read_them(
    study: optuna.Study,
) -> None:
    t4 = study.trials[4]
    assert stored_trial.constraints(t4)["slo_ttft"] == 0.5
    assert stored_trial.violated(t4) == ["slo_ttft"]
    assert stored_trial.constraints(study.trials[0]) == {n: -0.5 for n in CONSTRAINT_NAMES}
    # the list optuna-dashboard reads, in the order of the names
    assert t4.system_attrs["constraints"] == [-0.5, -0.5, 0.5]
    assert t4.user_attrs["constraint_names"] == list(CONSTRAINT_NAMES)
    # Optuna reads each once (its samplers sum or model them: none may count twice)
    assert sorted(t4.constraints.values()) == [-0.5, -0.5, 0.5]
    # Optuna's own front honours them: trial 4 would dominate 0, 1 and 2 otherwise
    assert {t.number for t in study.best_trials} == {0, 1, 2}
    infeasible = [
        d
        for d in optuna.visualization.plot_pareto_front(study).data
        if "Infeasible" in d.hovertemplate
    ]
    assert len(infeasible[0].x) == 3  # trial 4 and the failed 5 and 7, at the penalty values


def test_constraints_stored_per_name_are_read() -> None:
    """A study stored before the tuner kept the names apart: Optuna's per-name keys."""
    s = _new_study()
    _add(s, [1.0, 2.0], 0.3, per_name=True, slo_ttft=0.25)
    _add(s, [2.0, 1.0], 0.6, per_name=True)
    old, ok = s.trials
    assert stored_trial.constraints(old) == {
        "failed_cuda_oom": -0.5,
        "failed_invalid_config": -0.5,
        "slo_ttft": 0.25,
    }
    assert stored_trial.violated(old) == ["slo_ttft"]
    assert not stored_trial.feasible(old) and stored_trial.feasible(ok)
    assert plots.trial_points(s)["status"].tolist() == ["infeasible", "pareto"]


def test_trial_points_statuses_and_columns(study: optuna.Study) -> None:
    pts = plots.trial_points(study)
    assert list(pts["number"]) == list(range(10))
    assert dict(zip(pts["number"], pts["status"], strict=True)) == EXPECTED
    assert set(pts["status"]) <= set(plots.STATUSES)
    assert list(pts.loc[pts["baseline"], "number"]) == [0]
    reasons = dict(zip(pts["number"], pts["failure_reason"], strict=True))
    assert reasons[5] == "cuda_oom"
    assert reasons[7] == "invalid_config"
    assert reasons[8] == "interrupted"
    assert pd.isna(reasons[0])
    assert pts.loc[4, "violated"] == "slo_ttft"
    assert pts.loc[0, "params_x"] == 0.9
    assert pts.loc[0, "params_mode"] == "b"
    assert pts.loc[1, "state"] == "COMPLETE"


def test_failed_and_unfinished_trials_have_nan_objectives(study: optuna.Study) -> None:
    pts = plots.trial_points(study).set_index("number")
    for n in (5, 6, 7, 8, 9):
        assert math.isnan(pts.loc[n, "output_throughput"]), n
        assert math.isnan(pts.loc[n, "ttft_p95_ms"]), n
    # measured ones keep their values, infeasible included
    assert pts.loc[4, "output_throughput"] == 300.0
    assert pts.loc[2, "ttft_p95_ms"] == 120.0


def test_trial_points_of_an_empty_study() -> None:
    pts = plots.trial_points(_new_study())
    assert pts.empty
    assert {"number", "status", "output_throughput", "ttft_p95_ms"} <= set(pts.columns)


def test_pareto_step_is_the_dominated_region_boundary(study: optuna.Study) -> None:
    step = plots.pareto_step(plots.trial_points(study), OBJECTIVES)
    path = list(zip(step["output_throughput"], step["ttft_p95_ms"], strict=True))
    # max x / min y: from the highest throughput down, stay at the worse ttft, then step down
    assert path == [(200, 120), (150, 120), (150, 80), (100, 80), (100, 50)]
    assert [None if pd.isna(n) else int(n) for n in step["number"]] == [2, None, 1, None, 0]


def test_pareto_step_both_minimised() -> None:
    pts = pd.DataFrame(
        {"number": [0, 1, 2], "a": [1.0, 2.0, 3.0], "b": [3.0, 2.0, 1.0], "status": "pareto"}
    )
    step = plots.pareto_step(pts, [("a", "minimize"), ("b", "minimize")])
    path = list(zip(step["a"], step["b"], strict=True))
    assert path == [(1, 3), (2, 3), (2, 2), (3, 2), (3, 1)]


# --- Pareto figure --------------------------------------------------------------------------


def _marker_traces(fig: go.Figure) -> dict[str, Any]:
    return {tr.legendgroup: tr for tr in fig.data if tr.mode == "markers"}


def test_pareto_figure_traces_per_status_and_baseline(study: optuna.Study) -> None:
    fig = plots.pareto_figure(plots.trial_points(study), OBJECTIVES)
    traces = _marker_traces(fig)
    assert set(traces) == {"pareto", "feasible", "infeasible", "baseline"}
    assert sorted(traces["pareto"].x) == [100.0, 150.0, 200.0]
    assert list(traces["pareto"].customdata) == [0, 1, 2]
    assert list(traces["infeasible"].x) == [300.0]
    assert list(traces["feasible"].customdata) == [3]
    assert list(traces["baseline"].x) == [100.0]
    assert traces["baseline"].marker.symbol == "star"
    assert traces["baseline"].marker.size > traces["pareto"].marker.size
    notes = [a for a in fig.layout.annotations if a.text == "vLLM defaults"]
    assert len(notes) == 1
    assert (notes[0].x, notes[0].y) == (100.0, 50.0)
    # the staircase joins the front
    lines = [tr for tr in fig.data if tr.mode == "lines"]
    assert len(lines) == 1
    assert list(lines[0].x) == [200, 150, 150, 100, 100]
    # hover names the trial and its params
    hover = traces["pareto"].hovertext[list(traces["pareto"].customdata).index(1)]
    assert "trial 1" in hover
    assert "x=0.6" in hover
    assert "mode=b" in hover


def test_pareto_figure_counts_failed_trials_without_plotting_penalties(
    study: optuna.Study,
) -> None:
    fig = plots.pareto_figure(plots.trial_points(study), OBJECTIVES)
    plotted_y = [y for tr in fig.data for y in tr.y]
    plotted_x = [x for tr in fig.data for x in tr.x]
    assert 1e7 not in plotted_y
    assert 0.0 not in plotted_x
    title = fig.layout.title.text
    assert "failed (no measurement): 3" in title
    assert "cuda_oom ×1" in title
    assert "invalid_config ×1" in title
    assert "interrupted ×1" in title
    assert "pruned: 1" in title
    assert "running: 1" in title
    assert "5 measured of 10" in title


def test_pareto_figure_single_objective_plots_against_trial_number(study: optuna.Study) -> None:
    fig = plots.pareto_figure(plots.trial_points(study), OBJECTIVES[:1])
    traces = _marker_traces(fig)
    assert sorted(traces["pareto"].x) == [0, 1, 2]
    assert sorted(traces["infeasible"].x) == [4]
    best = [tr for tr in fig.data if tr.mode == "lines"]
    assert len(best) == 1
    assert list(best[0].y) == [100.0, 150.0, 200.0, 200.0]  # best feasible so far (max)
    assert fig.layout.xaxis.title.text == "trial"


def test_pareto_figure_rejects_unknown_objectives(study: optuna.Study) -> None:
    with pytest.raises(ValueError, match="not columns"):
        plots.pareto_figure(plots.trial_points(study), [("nope", "maximize")])
    with pytest.raises(ValueError, match="maximize"):
        plots.pareto_figure(plots.trial_points(study), [("output_throughput", "up")])


# --- Optuna's figures ---------------------------------------------------------------------------


def test_parallel_coordinates_use_measured_trials_only(study: optuna.Study) -> None:
    fig = plots.parallel_coordinates_figure(study, 1)
    # Optuna 5 draws a line (Scatter) per trial; customdata = [[axis label, shown value], ...]
    lines = [tr for tr in fig.data if tr.mode == "lines" and tr.customdata is not None]
    assert len(lines) == 5  # trials 0..4: no failed, pruned or running trial
    assert {tuple(tr.customdata[0])[0] for tr in lines} == {"ttft_p95_ms"}
    shown = sorted(float(tr.customdata[0][1]) for tr in lines)
    assert shown == [40.0, 50.0, 60.0, 80.0, 120.0]  # no 1e7 penalty
    dotted = [tr for tr in lines if tr.line.dash == "dot"]  # Optuna: infeasible = dotted
    assert [tr.customdata[0][1] for tr in dotted] == ["40"]
    assert "ttft_p95_ms" in fig.layout.title.text


def test_parallel_coordinates_without_measured_trials() -> None:
    s = _new_study()
    _add(s, [0.0, 1e7], 0.2, user_attrs={"failure_reason": "crash"}, failed_cuda_oom=1.0)
    fig = plots.parallel_coordinates_figure(s)
    assert not fig.data
    assert "no measured trial" in fig.layout.annotations[0].text


def test_importance_figure_one_panel_per_objective_on_measured_trials(
    study: optuna.Study, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[list[int]] = []
    real = optuna.visualization.plot_param_importances

    def spy(s: optuna.Study, **kwargs: Any) -> go.Figure:
        seen.append(sorted(t.number for t in s.trials))
        assert all(not t.user_attrs.get("failure_reason") for t in s.trials)
        return real(s, **kwargs)

    monkeypatch.setattr(optuna.visualization, "plot_param_importances", spy)
    fig = plots.importance_figure(study)
    bars = [tr for tr in fig.data if isinstance(tr, go.Bar)]
    assert len(bars) == 2  # one per objective
    assert {bars[0].xaxis, bars[1].xaxis} == {"x", "x2"}
    assert set(bars[0].y) == {"x", "mode"}
    assert len(seen) == 2
    assert all(len(numbers) == 5 for numbers in seen)  # trials 0..4 (copied, renumbered)
    assert "5 measured trials" in fig.layout.title.text


def test_importance_figure_explains_instead_of_raising(
    study: optuna.Study, monkeypatch: pytest.MonkeyPatch
) -> None:
    few = _new_study()
    _add(few, [100.0, 50.0], 0.5)
    _add(few, [0.0, 1e7], 0.2, user_attrs={"failure_reason": "crash"}, failed_cuda_oom=1.0)
    fig = plots.importance_figure(few)
    assert not fig.data
    assert "at least 2" in fig.layout.annotations[0].text

    def broken(*args: Any, **kwargs: Any) -> go.Figure:
        raise RuntimeError("evaluator exploded")

    real = optuna.visualization.plot_param_importances

    def second_broken(s: optuna.Study, **kwargs: Any) -> go.Figure:
        if kwargs["target_name"] == "ttft_p95_ms":
            raise RuntimeError("evaluator exploded")
        return real(s, **kwargs)

    monkeypatch.setattr(optuna.visualization, "plot_param_importances", second_broken)
    fig = plots.importance_figure(study)
    assert [tr.xaxis for tr in fig.data] == ["x"]  # the first objective's panel is drawn
    (note,) = [a for a in fig.layout.annotations if "exploded" in a.text]
    assert note.x > 0.5  # in the second (right) panel

    monkeypatch.setattr(optuna.visualization, "plot_param_importances", broken)
    fig = plots.importance_figure(study)
    assert not fig.data
    assert "could not evaluate" in fig.layout.annotations[0].text


# --- latency CDFs -------------------------------------------------------------------------------


def _request(i: int, ttft: float, e2e: float, out: int, **kw: Any) -> dict[str, Any]:
    row = {
        "index": i,
        "status": "ok",
        "t_sent_s": 0.1 * i,
        "ttft_s": ttft,
        "itl_s": [0.01, 0.02],
        "e2e_s": e2e,
        "prompt_tokens": 100,
        "output_tokens": out,
        "http_status": 200,
        "error": None,
        "warmup": False,
    }
    row.update(kw)
    return row


def _write_requests(tdir: Path, rows: list[dict[str, Any]], torn: bool = False) -> Path:
    tdir.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if torn:
        text += '{"index": 99, "status": "ok", "ttft'
    (tdir / "requests.jsonl").write_text(text)
    return tdir


@pytest.fixture
def trial_dirs(tmp_path: Path) -> dict[int, Path]:
    rng = np.random.default_rng(0)
    dirs = {}
    for n, scale in ((0, 0.1), (1, 0.2), (2, 0.05)):
        ttft = rng.exponential(scale, 41)
        rows = [_request(i, t, t + 1.0 + i * 0.01, 11 + i) for i, t in enumerate(ttft)]
        rows.append(_request(100, 50.0, 60.0, 10, warmup=True))  # excluded
        rows.append(_request(101, 40.0, 70.0, 10, status="error"))  # excluded
        rows.append(_request(102, 30.0, None, 10, status="timeout"))  # excluded
        dirs[n] = _write_requests(tmp_path / f"trial_{n:04d}", rows, torn=n == 1)
    dirs[3] = tmp_path / "trial_0003"  # not launched: no requests.jsonl
    dirs[3].mkdir()
    return dirs


def _ok_rows(tdir: Path) -> list[dict[str, Any]]:
    rows = []
    for line in (tdir / "requests.jsonl").read_text().splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        if r["status"] == "ok" and not r["warmup"]:
            rows.append(r)
    return rows


def test_latency_cdf_data_quantiles(trial_dirs: dict[int, Path]) -> None:
    frame = plots.latency_cdf_data(trial_dirs)
    assert list(frame.columns) == ["trial", "metric", "value_ms", "quantile", "n"]
    assert set(frame["trial"]) == {0, 1, 2}  # trial 3 has no file
    assert set(frame["metric"]) == {"ttft_ms", "tpot_ms", "e2e_ms"}
    for (trial, metric), g in frame.groupby(["trial", "metric"]):
        assert g["quantile"].is_monotonic_increasing, (trial, metric)
        assert g["value_ms"].is_monotonic_increasing, (trial, metric)
        assert g["quantile"].iloc[0] == 0.0
        assert g["quantile"].iloc[-1] == 1.0
        assert set(g["n"]) == {41}  # warm-up, errors and the torn line left out
    for trial in (0, 1, 2):
        rows = _ok_rows(trial_dirs[trial])
        ttft = np.array([r["ttft_s"] for r in rows]) * 1000
        e2e = np.array([r["e2e_s"] for r in rows]) * 1000
        tpot = np.array([(r["e2e_s"] - r["ttft_s"]) / (r["output_tokens"] - 1) for r in rows])
        g = frame[frame["trial"] == trial].set_index(["metric", "quantile"])["value_ms"]
        assert g[("ttft_ms", 0.5)] == pytest.approx(np.median(ttft))
        assert g[("ttft_ms", 1.0)] == pytest.approx(ttft.max())
        assert g[("ttft_ms", 0.0)] == pytest.approx(ttft.min())
        assert g[("e2e_ms", 0.99)] == pytest.approx(np.quantile(e2e, 0.99))
        assert g[("tpot_ms", 0.5)] == pytest.approx(np.median(tpot) * 1000)


def test_latency_cdf_data_itl_and_unknown_metric(trial_dirs: dict[int, Path]) -> None:
    frame = plots.latency_cdf_data({0: trial_dirs[0]}, metrics=("itl_ms",))
    assert set(frame["n"]) == {82}  # two gaps per request
    assert frame["value_ms"].min() == pytest.approx(10.0)
    assert frame["value_ms"].max() == pytest.approx(20.0)
    with pytest.raises(ValueError, match="unknown latency metrics"):
        plots.latency_cdf_data(trial_dirs, metrics=("ttft_s",))
    assert plots.latency_cdf_data({}).empty


def test_trial_labels_say_why_a_trial_is_not_feasible(study: optuna.Study) -> None:
    labels = plots.trial_labels(plots.trial_points(study))
    assert labels == {
        0: "trial 0 (vLLM defaults)",
        1: "trial 1",
        2: "trial 2",
        3: "trial 3",
        4: "trial 4 (infeasible: slo_ttft)",
        5: "trial 5 (failed: cuda_oom)",
        6: "trial 6 (pruned)",
        7: "trial 7 (failed: invalid_config)",
        8: "trial 8 (failed: interrupted)",
        9: "trial 9 (running)",
    }


def test_latency_cdf_figure(trial_dirs: dict[int, Path]) -> None:
    frame = plots.latency_cdf_data(trial_dirs)
    fig = plots.latency_cdf_figure(
        frame, labels={0: "trial 0 (vLLM defaults)"}, highlight=[0, 2], infeasible={1}
    )
    dashed = {tr.legendgroup for tr in fig.data if tr.line.dash == "dash"}
    assert dashed == {"trial 1"}  # the infeasible trial, in every panel
    assert len(fig.data) == 9  # 3 trials x 3 metric panels
    assert {tr.xaxis for tr in fig.data} == {"x", "x2", "x3"}
    legend = [tr for tr in fig.data if tr.showlegend]
    assert [tr.name for tr in legend] == ["trial 0 (vLLM defaults)", "trial 1", "trial 2"]
    hidden = {tr.legendgroup for tr in fig.data if tr.visible == "legendonly"}
    assert hidden == {"trial 1"}
    # a trial keeps its colour across panels
    for group in ("trial 0", "trial 1", "trial 2"):
        assert len({tr.line.color for tr in fig.data if tr.legendgroup == group}) == 1
    empty = plots.latency_cdf_figure(plots.latency_cdf_data({}))
    assert not empty.data
    assert "no measured requests" in empty.layout.annotations[0].text


# --- telemetry timeline -------------------------------------------------------------------------


def _write_telemetry(tdir: Path, gpus: bool = True) -> Path:
    tdir.mkdir(parents=True, exist_ok=True)
    gpu_rows = []
    if gpus:  # the rows GpuSampler.sample_once writes (a field NVML could not read is absent)
        for i in range(4):
            for g in (0, 1):
                gpu_rows.append(
                    {
                        "t_s": 0.5 * i,
                        "gpu": float(g),
                        "mem_used_gib": 60.0 + i + g,
                        "util_pct": 90.0,
                        "power_w": 400.0 + g,
                    }
                )
        gpu_rows.append({"t_s": 2.0, "gpu": 0.0, "mem_used_gib": 64.0})
    (tdir / "gpu.jsonl").write_text("".join(json.dumps(r) + "\n" for r in gpu_rows))
    prom = [
        {
            "t_s": float(i),
            "vllm:kv_cache_usage_perc": 0.25 * i,
            "vllm:num_requests_running": 10.0 * i,
            "vllm:num_requests_waiting": float(i),
            "vllm:num_preemptions_total": 0.0,
        }
        for i in range(3)
    ]
    (tdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in prom))
    return tdir


def test_timeline_data(tmp_path: Path) -> None:
    frame = plots.timeline_data(_write_telemetry(tmp_path / "t"))
    assert list(frame.columns) == ["t_s", "series", "value", "panel"]
    series = set(frame["series"])
    assert series == {
        *(
            f"GPU {g} {what}"
            for g in (0, 1)
            for what in ("memory used (GiB)", "utilisation (%)", "power (W)")
        ),
        "KV cache usage (%)",
        "running requests",
        "waiting requests",
    }
    kv = frame[frame["series"] == "KV cache usage (%)"].sort_values("t_s")
    assert list(kv["value"]) == [0.0, 25.0, 50.0]  # vLLM's 0..1 gauge as %
    mem0 = frame[frame["series"] == "GPU 0 memory used (GiB)"]
    assert list(mem0["t_s"]) == [0.0, 0.5, 1.0, 1.5, 2.0]
    assert mem0["value"].max() == 64.0
    assert len(frame[frame["series"] == "GPU 0 utilisation (%)"]) == 4  # absent field skipped
    assert set(frame.loc[frame["series"].str.contains("memory"), "panel"]) == {"gpu_memory"}


def test_timeline_data_without_files(tmp_path: Path) -> None:
    frame = plots.timeline_data(tmp_path)
    assert frame.empty
    assert list(frame.columns) == ["t_s", "series", "value", "panel"]


def test_timeline_figure_panels(tmp_path: Path) -> None:
    fig = plots.timeline_figure(plots.timeline_data(_write_telemetry(tmp_path / "t")), "Trial 7")
    titles = [a.text for a in fig.layout.annotations]
    assert titles[:5] == [
        "GPU memory used (GiB)",
        "GPU utilisation (%)",
        "GPU power (W)",
        "KV cache usage (%)",
        "requests running / waiting",
    ]
    by_name = {tr.name: tr for tr in fig.data}
    assert by_name["KV cache usage (%)"].yaxis == "y4"
    assert by_name["GPU 1 memory used (GiB)"].yaxis == "y"
    assert by_name["waiting requests"].yaxis == "y5"
    assert fig.layout.title.text == "Trial 7"


def test_timeline_figure_without_gpu_samples_or_any(tmp_path: Path) -> None:
    frame = plots.timeline_data(_write_telemetry(tmp_path / "t", gpus=False))
    fig = plots.timeline_figure(frame, "sim")
    texts = [a.text for a in fig.layout.annotations]
    assert texts[:3] == [
        "GPU memory used (GiB)",
        "KV cache usage (%)",
        "requests running / waiting",
    ]
    assert any(t.startswith("no samples") for t in texts)
    assert {tr.yaxis for tr in fig.data} == {"y2", "y3"}
    empty = plots.timeline_figure(plots.timeline_data(tmp_path / "none"), "none")
    assert not empty.data
    assert "no telemetry" in empty.layout.annotations[0].text


# --- write_figures ------------------------------------------------------------------------------


def test_write_figures(study: optuna.Study, trial_dirs: dict[int, Path], tmp_path: Path) -> None:
    _write_telemetry(trial_dirs[0])
    trial_dirs[4] = _write_requests(tmp_path / "trial_0004", _ok_rows(trial_dirs[1]))
    out = tmp_path / "figures"
    written = plots.write_figures(study, out, trial_dirs, OBJECTIVES, timeline_trials=[0, 3, 4])
    expected = {
        "plotly.min.js",
        "pareto.html",
        "pareto.csv",
        "parallel_coordinates.html",
        "importances.html",
        "latency_cdf.html",
        "latency_cdf.csv",
        "timeline.html",
        "timeline_0.csv",
        "timeline_3.csv",
        "timeline_4.csv",
    }
    assert set(written) == expected
    assert {p.name for p in out.iterdir()} == expected
    assert all(written[name] == out / name for name in expected)
    assert (out / "plotly.min.js").read_text() == get_plotlyjs()  # this plotly's, once
    for name in expected:
        if name.endswith(".html"):
            text = (out / name).read_text()
            assert not SCRIPT_URL.findall(text), name  # nothing loaded from a CDN
            assert text.count('src="plotly.min.js"') == 1, name
            assert len(text) < 500_000, name  # plotly.js not inlined in each page
    assert (out / "parallel_coordinates.html").read_text().count("Plotly.newPlot") == 2
    # the trials' timelines share one page (one plotly.js where MLflow gets the page alone), in order
    page = (out / "timeline.html").read_text()
    assert page.count("Plotly.newPlot") == 3
    titles = [page.index(f"Trial {n}") for n in (0, 3)] + [page.index("Trial 4 (infeasible")]
    assert titles == sorted(titles)
    pts = pd.read_csv(out / "pareto.csv")
    assert dict(zip(pts["number"], pts["status"], strict=True)) == EXPECTED
    cdf = pd.read_csv(out / "latency_cdf.csv")
    assert set(cdf["trial"]) == {0, 1, 2, 4}
    # the infeasible trial says so in the legend (dashed) and in its timeline's title
    assert '"name":"trial 4 (infeasible: slo_ttft)"' in (out / "latency_cdf.html").read_text()
    assert "Trial 4 (infeasible: slo_ttft): telemetry" in page
    timeline = pd.read_csv(out / "timeline_0.csv")
    assert "KV cache usage (%)" in set(timeline["series"])


def test_write_figures_survives_a_failing_figure(
    study: optuna.Study,
    trial_dirs: dict[int, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def boom(*args: Any, **kwargs: Any) -> go.Figure:
        raise RuntimeError("drawing failed")

    # patched where write_figures looks it up (tuner.plots.write), not the package re-export
    monkeypatch.setattr(plots_write, "pareto_figure", boom)
    out = tmp_path / "figures"
    with caplog.at_level(logging.INFO, logger="tuner"):
        written = plots.write_figures(study, out, trial_dirs, OBJECTIVES, timeline_trials=[42])
    assert "pareto.html" not in written
    assert "plotly.min.js" in written
    assert not (out / "pareto.html").exists()
    for name in ("parallel_coordinates.html", "importances.html", "latency_cdf.html"):
        assert (out / name).is_file(), name
    assert "timeline.html" not in written  # no dir for trial 42: skipped, logged, no empty page
    records = [r for r in caplog.records if r.name == "tuner"]
    assert any("pareto" in r.getMessage() and "drawing failed" in r.getMessage() for r in records)
    # a trial folder that is not on this machine (a resumed study) is not an error
    (absent,) = [r for r in records if "trial 42's timeline" in r.getMessage()]
    assert absent.levelno == logging.INFO
    assert "not on this machine" in absent.getMessage()


# --- the figures as a person opens them: a browser without network ------------------------------

SCRIPT_URL = re.compile(r"<script[^>]*\bsrc=[\"']?(?:https?:)?//", re.IGNORECASE)
"""A script tag that loads from the network (``http://``, ``https://`` or ``//``)."""


def test_self_contained_copy_inlines_plotly(
    study: optuna.Study, trial_dirs: dict[int, Path], tmp_path: Path
) -> None:
    out = tmp_path / "figures"
    plots.write_figures(study, out, trial_dirs, OBJECTIVES)
    alone = tmp_path / "alone"
    alone.mkdir()
    copy = plots.self_contained(out / "pareto.html", alone)
    assert copy == alone / "pareto.html"
    text = copy.read_text()
    assert "plotly.min.js" not in text and get_plotlyjs() in text
    assert not SCRIPT_URL.findall(text)
    with pytest.raises(ValueError, match="does not load plotly.min.js"):
        plots.self_contained(copy, tmp_path)  # already inline


# a capacity card (capacity_card.json's content) with a tier outside the measured loads
CARD = {
    "slo": {"ttft_ms": 2000.0, "percentile": 95.0},
    "scales": [0.5, 1.0],
    "target_rps": 100.0,
    "entries": [
        {
            "trial": t,
            "label": f"trial {t}",
            "baseline": t == 0,
            "gpus_per_server": 1,
            "tiers": {
                "0.5": {"rps": 0.0, "low": 0.0, "high": 9.0, "n": 1, "outside": "below"},
                "1": {"rps": 20.0 + t, "low": 18.0, "high": 23.0 + t, "n": 3, "outside": None},
            },
            "plan": {"gpus": 5, "gpus_low": 5, "gpus_high": 6},
        }
        for t in (0, 1)
    ],
}


def test_figures_draw_in_a_browser_without_network(
    study: optuna.Study, trial_dirs: dict[int, Path], tmp_path: Path
) -> None:
    """Every kind of figure, opened from its folder (file://) in headless Chromium with no
    network, is drawn by plotly; so is the self-contained copy MLflow gets, alone in a folder.
    A page that loads plotly.js from the CDN draws nothing there: the check can fail."""
    _write_telemetry(trial_dirs[0])
    out = tmp_path / "figures"
    written = plots.write_figures(
        study, out, trial_dirs, OBJECTIVES, timeline_trials=[0, 1], card=CARD
    )
    pages = sorted(p for p in written.values() if p.suffix == ".html")
    assert {p.name for p in pages} == {
        "pareto.html",
        "parallel_coordinates.html",
        "importances.html",
        "latency_cdf.html",
        "timeline.html",
        "capacity_card.html",
    }
    alone = tmp_path / "alone"
    alone.mkdir()
    mlflow_copy = plots.self_contained(out / "latency_cdf.html", alone)
    cdn = tmp_path / "cdn" / "pareto.html"
    cdn.parent.mkdir()
    plots.pareto_figure(plots.trial_points(study), OBJECTIVES).write_html(
        cdn, include_plotlyjs="cdn"
    )
    assert SCRIPT_URL.findall(cdn.read_text())  # what the network check catches
    for page in [*pages, mlflow_copy]:
        assert not SCRIPT_URL.findall(page.read_text()), page.name
    seen = chromium.drawn([*pages, mlflow_copy, cdn])
    for page in [*pages, mlflow_copy]:
        # a plot per objective; a timeline per trial shown
        n = 2 if page.name in ("parallel_coordinates.html", "timeline.html") else 1
        assert seen[page] == chromium.Drawn(figures=n, drawn=n, plotly=True), page
    assert seen[cdn] == chromium.Drawn(figures=1, drawn=0, plotly=False)  # offline: blank
