"""What the study itself stores (tuner/stored_study.py): the confirm record written and read back,
a record an older tuner stored, and which baseline trial each caller counts."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from tuner.config import ConfirmConfig
from tuner.records import Candidate, ConfirmResult, TrialResult
from tuner.stored_study import ConfirmRecord, ConfirmRuns, baseline_trial, baseline_trials
from tuner.verdict import Gain, Verdict

ROOT = Path(__file__).resolve().parents[2]
OLD = ROOT / "docs" / "gpu-runs" / "2026-11-30-h200x2-studies" / "chat256-optuna.db"
"""A study stored before confirm rounds, the minimum effect and verdicts existed."""


def test_a_confirm_record_reads_back_as_it_was_stored(tmp_path: Path) -> None:
    cc = ConfirmConfig(seeds=[1, 2], rounds=1)
    cand = Candidate(3, ("goodput", "knee"), {"max_num_seqs": 64}, False, ("/m",), {"goodput": 9.5})
    runs = ({"round": 1, "seed": 1, "ok": True, "violated": [], "goodput": 9.0},)
    result = ConfirmResult(3, cand.picks, cand.params, True, None, {"goodput": 9.0}, {}, runs)
    verdict = Verdict("undetermined", "goodput", True, 3, 3, None, 1, 0.03, {3: Gain(0.12)})
    record = ConfirmRecord.of(cc, 7, (cand,), (result,), verdict)
    storage = f"sqlite:///{tmp_path / 'db.sqlite'}"  # through JSON and back
    study = optuna.create_study(study_name="s", storage=storage)
    assert ConfirmRecord.from_study(study) is None
    record.store(study)
    back = ConfirmRecord.from_study(optuna.load_study(study_name="s", storage=storage))
    assert back == record and back.same_stress(cc)
    for other in (ConfirmConfig(seeds=[1]), ConfirmConfig(seeds=[1, 2], rounds=2)):
        assert not back.same_stress(other), other


def _server(reason: str | None) -> TrialResult:
    return TrialResult(3, {}, (), None, {}, {"capacity_rps": 9.0}, failure_reason=reason)


@pytest.mark.parametrize(
    ("reason", "kept"),
    [
        (None, True),
        ("engine_dead", True),  # it became ready and died under load: the config's
        ("cuda_oom", True),
        ("crash", False),  # an exit before ready without a known message: maybe the machine's
        ("gpu_busy", False),
        ("startup_timeout", False),
    ],
)
def test_a_confirm_server_is_kept_unless_the_machine_may_have_failed_it(
    tmp_path: Path, reason: str | None, kept: bool
) -> None:
    study = optuna.create_study(study_name="s", storage=f"sqlite:///{tmp_path / 'db.sqlite'}")
    runs = ConfirmRuns.of(study, "k")
    runs.put(study, 3, 1, [(1, _server(reason))])
    back = ConfirmRuns.of(study, "k").get(3, 1)
    assert (back is not None) == kept
    if back is not None:
        assert back[0][1].failure_reason == reason and back[0][1].metrics["capacity_rps"] == 9.0
    assert ConfirmRuns.of(study, "other").get(3, 1) is None  # another stress: nothing stored


def test_a_verdict_with_a_server_the_machine_may_have_failed_is_not_reused() -> None:
    cc = ConfirmConfig(seeds=[1], rounds=2)
    cand = Candidate(3, ("capacity",), {}, False, ("/m",), {})
    rows = (
        {"round": 1, "seed": 1, "ok": True, "failure_reason": None, "violated": []},
        {"round": 2, "seed": 1, "ok": False, "failure_reason": "crash", "violated": []},
    )
    crashed = ConfirmResult(3, cand.picks, {}, False, "crash", {}, {}, rows)
    held = ConfirmResult(4, ("baseline",), {}, True, None, {}, {}, rows[:1])
    base = Candidate(4, ("baseline",), {}, True, ("/m",), {})
    record = ConfirmRecord.of(cc, 5, (cand, base), (crashed, held), None)
    assert list(record.reusable(cc)) == [4]
    assert record.reusable(ConfirmConfig(seeds=[1], rounds=3)) == {}


@pytest.mark.skipif(not OLD.is_file(), reason="the stored H200 study is not in this checkout")
def test_a_record_an_older_tuner_stored_still_reads() -> None:
    study = optuna.load_study(study_name="chat256-qwen3-8b", storage=f"sqlite:///{OLD}")
    record = ConfirmRecord.from_study(study)
    assert record is not None
    assert (record.rounds, record.min_effect, record.verdict) == (1, None, None)
    assert record.n_trials == 14
    assert record.seeds == (1, 2) and len(record.results) == len(record.candidates) == 2
    assert all(len(r.runs) == 2 for r in record.results)
    assert not {"min_effect", "verdict"} & set(record.as_dict())  # confirm.json: as stored


def test_each_caller_names_which_baseline_trials_count() -> None:
    study = optuna.create_study()
    dist = {"x": optuna.distributions.FloatDistribution(0, 1)}

    def add(state: optuna.trial.TrialState, slo: float | None, baseline: bool = True) -> int:
        study.add_trial(
            optuna.trial.create_trial(
                state=state,
                params={"x": 0.5},
                distributions=dist,
                values=None if state != optuna.trial.TrialState.COMPLETE else [1.0],
                user_attrs={"baseline": baseline, "constraint_names": ["slo_ttft"]},
                system_attrs={} if slo is None else {"constraints": [slo]},
            )
        )
        return study.trials[-1].number

    interrupted = add(optuna.trial.TrialState.FAIL, None)
    missed_slo = add(optuna.trial.TrialState.COMPLETE, 0.2)
    feasible = add(optuna.trial.TrialState.COMPLETE, -0.2)
    add(optuna.trial.TrialState.COMPLETE, -0.2, baseline=False)
    study.enqueue_trial({"x": 0.5}, user_attrs={"baseline": True})
    waiting = study.trials[-1].number
    numbers = {
        which: [t.number for t in baseline_trials(study, which=which)]
        for which in ("any", "live", "measured", "feasible")
    }
    assert numbers == {
        "any": [interrupted, missed_slo, feasible, waiting],
        "live": [missed_slo, feasible, waiting],
        "measured": [missed_slo, feasible],
        "feasible": [feasible],
    }
    t = baseline_trial(study, which="measured")
    assert t is not None and t.number == missed_slo
    assert baseline_trial(optuna.create_study(), which="any") is None
