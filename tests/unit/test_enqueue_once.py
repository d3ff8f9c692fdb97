"""Enqueued configs (the baseline, study.enqueue, warm start) run again after an interruption."""

from __future__ import annotations

import optuna

from tuner.grid import GridSampler
from tuner.space import defaults, distributions, grid
from tuner.storage import enqueue_once, fill_queue, mark_baseline, open_study
from tuner.stored_study import baseline_trial
from tuner.stored_trial import is_baseline, mark_interrupted

DISTS = {
    "gmu": optuna.distributions.FloatDistribution(0.1, 0.95),
    "eager": optuna.distributions.CategoricalDistribution([False, True]),
}


def test_a_failed_trial_does_not_count_but_a_finished_or_waiting_one_does() -> None:
    study = optuna.create_study()
    params = {"gmu": 0.6, "eager": True}
    assert enqueue_once(study, params)
    assert not enqueue_once(study, dict(params))  # waiting already
    t = study.ask(DISTS)
    assert t.params == params
    study.tell(t, state=optuna.trial.TrialState.FAIL)  # interrupted
    assert enqueue_once(study, params)  # so it is queued again
    t = study.ask(DISTS)
    study.tell(t, 1.0)
    assert not enqueue_once(study, params)
    assert not enqueue_once(study, {"gmu": 0.6 + 1e-12, "eager": True})
    assert enqueue_once(study, {"gmu": 0.6, "eager": False})
    assert enqueue_once(study, {"gmu": 0.61, "eager": True})


def test_a_live_baseline_ignores_a_failed_one() -> None:
    study = optuna.create_study()
    study.enqueue_trial({"gmu": 0.92, "eager": False}, user_attrs={"baseline": True})
    t = study.ask(DISTS)
    assert baseline_trial(study, which="live") is not None  # running
    study.tell(t, state=optuna.trial.TrialState.FAIL)
    assert baseline_trial(study, which="live") is None


def test_a_draw_at_the_defaults_is_a_baseline_trial(make_cfg) -> None:
    """A grid's cell of vLLM's defaults (or any draw at them) is flagged as the baseline, so the
    confirm stage's ``baseline`` pick finds it in a study run with study.baseline_first=false."""
    cfg = make_cfg("+workload=chat", "space=levers", "study=grid")
    study = optuna.create_study()
    study.enqueue_trial(defaults(cfg.space))  # as the grid draws it: no user attribute
    study.enqueue_trial({**defaults(cfg.space), "quantization": "fp8"})
    dists = distributions(cfg.space)
    at_defaults, fp8 = study.ask(dists), study.ask(dists)
    assert not is_baseline(at_defaults)
    assert mark_baseline(at_defaults, cfg) and is_baseline(at_defaults)
    assert not mark_baseline(fp8, cfg) and not is_baseline(fp8)
    study.tell(at_defaults, 1.0)
    assert baseline_trial(study, which="measured") is not None


def test_an_interrupted_grid_cell_runs_again_and_only_once(make_cfg) -> None:
    """Optuna's grid sampler counts a FAIL trial's cell as visited: the next run enqueues the
    interrupted cell, once, and not after it completed."""
    cfg = make_cfg("+workload=chat", "space=levers", "study=grid", "study.baseline_first=false")
    study = optuna.create_study(sampler=GridSampler(grid(cfg.space), seed=1))
    dists = distributions(cfg.space)
    lost = study.ask(dists)
    mark_interrupted(study, lost, "the machine went away")
    failed = study.ask(dists)  # a FAIL without failure_reason interrupted (a tuner bug)
    study.tell(failed, state=optuna.trial.TrialState.FAIL)
    fill_queue(study, cfg, dists, None, [], n_stored=2)  # type: ignore[arg-type]
    again = study.ask(dists)
    assert again.params == lost.params
    fill_queue(study, cfg, dists, None, [], n_stored=3)  # type: ignore[arg-type]
    study.tell(again, 1.0)
    fill_queue(study, cfg, dists, None, [], n_stored=3)  # type: ignore[arg-type]
    waiting = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert waiting == []  # enqueued once (live) and not after it completed
    assert study.ask(dists).params not in (lost.params, failed.params)  # the grid goes on
    for _ in range(7):  # every cell told, the enqueued one among them: Optuna's grid sampler
        t = study.ask(dists)  # would raise from study.stop() outside study.optimize here
        study.tell(t, 1.0)
    done = {tuple(t.params.values()) for t in study.trials if t.state.is_finished()}
    assert len(done) == 8  # every combination, the lost one measured again


def test_a_grid_study_continued_runs_each_cell_once(make_cfg) -> None:
    """Optuna shuffles the grid's cell ids with the sampler's seed: a run that continues a grid
    study (another process, more stored trials) must see the same ids, else it runs cells twice
    and leaves others out."""
    cfg = make_cfg("+workload=chat", "space=levers", "study=grid", "study.baseline_first=false")
    dists = distributions(cfg.space)
    cells = []
    for n in (3, 2, 3):  # three runs of the same command, each opening the study again
        study = open_study(cfg)
        for _ in range(n):
            t = study.ask(dists)
            cells.append(tuple(t.params.values()))
            study.tell(t, 1.0)
    assert len(set(cells)) == 8


def test_a_study_without_a_baseline_says_so_when_it_gets_one(make_cfg, caplog) -> None:
    """baseline_first on a study whose trials ran without it (a grid run with
    study.baseline_first=false): the log says it has none yet, not that it was interrupted."""
    cfg = make_cfg("+workload=chat", "space=levers")
    study = optuna.create_study()
    dists = distributions(cfg.space)
    study.enqueue_trial({**defaults(cfg.space), "quantization": "fp8"})
    study.tell(study.ask(dists), 1.0)
    caplog.set_level("INFO", logger="tuner")
    fill_queue(study, cfg, dists, None, [], n_stored=1)  # type: ignore[arg-type]
    assert "the study has no baseline trial (vLLM's defaults) yet; enqueued" in caplog.text
    assert "not finished yet" not in caplog.text
    t = study.ask(dists)
    assert is_baseline(t)
    study.tell(t, state=optuna.trial.TrialState.FAIL)  # interrupted
    caplog.clear()
    fill_queue(study, cfg, dists, None, [], n_stored=2)  # type: ignore[arg-type]
    assert "has not finished yet; enqueued again" in caplog.text
