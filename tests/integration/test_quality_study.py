"""The confirm stage's quality guard in a whole simulated study: two picks that change numerics
(an fp8 KV cache, n-gram speculative decoding) and vLLM's defaults replay the eval set on their
confirm servers; under ``confirm.quality.measure=exact_match`` the fp8 KV cache (the simulator
changes 69 % of its outputs, as the H200 did) is demoted with the reason ``quality`` and the
n-gram one (lossless) passes: in the stored record, the verdict line, the export headers, MLflow
and ``report``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
from helpers.cli import FAST, mlflow_runs, run_study

import tuner.study as study_mod
from tuner import confirm, stored_trial
from tuner.config import TunerConfig
from tuner.records import Candidate
from tuner.report import run_report
from tuner.storage import storage_url
from tuner.stored_study import ConfirmRecord

pytestmark = pytest.mark.integration


def test_a_pick_that_changes_numerics_is_judged_on_the_eval_set(
    tmp_path: Path,
    make_cfg: Callable[..., TunerConfig],
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    args = (
        "+workload=chat",
        "model.load_format=null",  # the simulator, as if its weights were real
        "space=ngram",
        "study.n_trials=3",
        "study.name=quality",
        "confirm.picks=[throughput,latency,baseline]",
        "confirm.quality.measure=exact_match",
        # the first 40 items: 16 of the fp8 KV cache's outputs differ (exact match 0.6; 0.33 on
        # all 280), n-gram speculation's none
        "confirm.quality.min_agreement=0.7",
        "confirm.quality.limit=40",
        *FAST,
    )
    cfg = make_cfg(*args)
    ngram = cfg.space.params["speculative_config"].choices[-1]  # conf/space/ngram.yaml's K=4
    cfg.study.enqueue = [{"kv_cache_dtype": "fp8"}, {"speculative_config": ngram}]
    real_pick = confirm.pick

    def pick(study: optuna.Study, objective: object, picks: object) -> list[Candidate]:
        # on the simulator the three configs serve alike: which one the throughput and latency
        # picks take is noise, so the two enqueued ones are confirmed under those names
        out = real_pick(study, cfg.objective, ["baseline"])
        for t, name in zip(study.trials[1:3], ("throughput", "latency"), strict=True):
            serve = tuple(stored_trial.serve_args(t))
            out.append(Candidate(t.number, (name,), dict(t.params), False, serve, {}))
        return out

    monkeypatch.setattr(study_mod, "pick", pick)
    monkeypatch.chdir(tmp_path)  # MLflow's artifacts (./mlruns) stay out of the repository
    out = run_study(cfg, capsys, caplog)
    study = optuna.load_study(study_name="quality", storage=storage_url(cfg))
    assert [stored_trial.changes_numerics(t) for t in study.trials] == [
        [],
        ["kv_cache_dtype=fp8"],
        [f"speculative_config={ngram}"],
    ]
    assert "confirm: quality guard on trial 1 (kv_cache_dtype=fp8), trial 2" in out
    # the n-gram trial's acceptance from /metrics (the simulator's: the H200's 0.387)
    accept = [stored_trial.metric(t, "spec_decode_acceptance") for t in study.trials]
    assert accept[:2] == [None, None] and accept[2] == pytest.approx(0.387, abs=0.01)
    record = ConfirmRecord.from_study(study)
    assert record is not None
    by_trial = {r.trial: r for r in record.results}
    kv, ngram = by_trial[1], by_trial[2]
    assert by_trial[0].quality is None  # the reference itself
    q = kv.quality or {}
    assert q["status"] == "measured" and q["rounds"][0]["n"] == 40
    assert q["rounds"][0]["tokens_compared"] > 0  # logprobs came back over HTTP
    assert q["agreement"] < 0.7 and not kv.passed
    assert (kv.reason or "").startswith("quality: exact match")
    assert (ngram.quality or {})["agreement"] == 1.0 and ngram.passed
    assert record.verdict is not None and record.verdict.recommended != 1
    verdict = " ".join(out[out.index("Verdict: ") :].split())  # the console wraps it
    assert "[trial 1 quality: exact match" in verdict
    assert "below confirm.quality.min_agreement 0.70; trial 2 quality: exact match 1.00" in verdict
    run_dir = Path(cfg.paths.output_dir)
    kv_header = (run_dir / "best-throughput.yaml").read_text()
    assert "DEMOTED under" in kv_header and "quality: exact match" in kv_header
    assert (
        "# quality: exact match 1.00 with vLLM's defaults"
        in (run_dir / "best-latency.yaml").read_text()
    )
    (parent,) = [
        r for r in mlflow_runs(tmp_path, "quality") if r.data.tags.get("tuner.role") != "trial"
    ]
    assert parent.data.tags["tuner.quality_demoted"] == "1"
    assert parent.data.metrics["quality_agreement.trial_1"] == q["agreement"]
    assert parent.data.metrics["quality_agreement.trial_2"] == 1.0
    # the report, from storage alone, says the same
    again = make_cfg(*args, f"paths.output_dir={tmp_path / 'report'}")
    capsys.readouterr()
    run_report(again)
    shown = " ".join(capsys.readouterr().out.split())
    assert "[trial 1 quality: exact match" in shown and "DEMOTED" in shown
