"""The capacity card of a small ``objective=capacity`` study with its confirm stage, on the
simulator, in process: capacity per SLO tier from each trial's stored steps, the confirm rounds'
interval at the workload's SLO, servers and GPUs for a target load and the cost per 1M tokens, in
the run dir (``capacity_card.json``, the figure), on the console and in MLflow; and again from
storage by ``report``."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.capacity import BINDING_SLOS

import tuner.study as study_mod
from tuner.config import TunerConfig
from tuner.report import run_report
from tuner.storage import study_name

pytestmark = pytest.mark.integration

# as tests/integration/test_capacity_study.py: the SLOs bind at a few requests/s
SMALL = [
    *BINDING_SLOS,
    "space=none",
    # the workload's own replay (4 in flight, far below the capacity) of 30 requests, not 60;
    # each later step measures 100 (objective.capacity.requests, MIN_STEP_REQUESTS), as before
    "workload.num_requests=30",
    "objective.capacity.requests=100",
    "objective.capacity.max_steps=5",
    "study.n_trials=1",
    "confirm.picks=[baseline]",
    "confirm.rounds=2",
    "confirm.load_factor=1.0",
    "confirm.duration_factor=1.0",
    "plan.target_rps=100",
    "plan.gpu_hour_usd=3.6",
    "plan.slo_scales=[0.5,1.0,2.0]",
]


def test_the_card_of_a_capacity_study(
    make_cfg: Callable[..., TunerConfig], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = make_cfg(*SMALL)
    study_mod.run(cfg)
    out = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    run = tmp_path / "run"
    card = json.loads((run / "capacity_card.json").read_text())
    assert card["target_rps"] == 100.0 and card["gpu_hour_usd"] == 3.6
    assert card["slo"] == {"ttft_ms": 4000.0, "tpot_ms": 10.0, "percentile": 95.0}
    (e,) = card["entries"]
    assert e["baseline"] and e["gpus_per_server"] == 1
    tiers = e["tiers"]
    assert set(tiers) == {"0.5", "1", "2"}
    own = tiers["1"]
    assert own["n"] == 2  # the confirm stage's two rounds on fresh servers
    assert own["outside"] is None and 0 < own["low"] <= own["rps"] <= own["high"]
    # the stricter tier holds less (or lies below the loads measured), the looser one more
    assert tiers["0.5"]["outside"] == "below" or tiers["0.5"]["rps"] <= own["rps"] * 1.0001
    assert tiers["2"]["rps"] >= own["rps"]  # never lower when looser
    # the second server started its search where the first crossed (confirm.capacity_start),
    # one slot of the closed loop at most above it (4 in flight at the stressed load)
    first, second = (
        json.loads((run / "confirm" / "trial_0000" / f"round_{r}" / "capacity.json").read_text())
        for r in (1, 2)
    )
    crossed = first["capacity"]["capacity_factor"]
    assert crossed <= second["steps"][1]["factor"] < crossed + 1 / 4 + 1e-9, (first, second)
    plan = e["plan"]
    assert plan["servers"] == plan["gpus"] == -(-100 // own["rps"])  # ceil(target / capacity)
    assert plan["servers_low"] <= plan["servers"] <= plan["servers_high"]
    tokens = e["output_tokens_per_request"]
    assert 16 <= tokens <= 32
    assert plan["usd_per_m_requests"] == pytest.approx(0.001 / own["rps"] * 1e6)
    assert plan["usd_per_m_output_tokens"] == pytest.approx(0.001 / (own["rps"] * tokens) * 1e6)
    assert (run / "capacity_card.html").is_file() and (run / "capacity_card.csv").is_file()
    assert "Capacity card" in out and "servers for 100" in out  # a header cell wraps

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=cfg.tracking.uri)
    exp = client.get_experiment_by_name(cfg.tracking.experiment or study_name(cfg))
    assert exp is not None
    parents = [
        r
        for r in client.search_runs([exp.experiment_id])
        if r.data.tags.get("tuner.role") not in ("trial", "confirm")
        and "card_0_servers" in r.data.metrics
    ]
    assert parents, "no run carries the card's metrics"
    parent = parents[0]
    assert parent.data.metrics["card_0_servers"] == plan["servers"]
    names = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert "capacity_card.json" in names

    # the same card again from storage, with another price
    again = make_cfg(*SMALL, "plan.gpu_hour_usd=7.2", f"paths.output_dir={tmp_path / 'report'}")
    published = run_report(again)
    assert "capacity_card.json" in published.files
    card2 = json.loads((tmp_path / "report" / "capacity_card.json").read_text())
    (e2,) = card2["entries"]
    assert e2["tiers"] == tiers
    assert e2["plan"]["usd_per_m_requests"] == pytest.approx(2 * plan["usd_per_m_requests"])
