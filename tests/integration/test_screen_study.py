"""A tiny lever screen on the simulator (in process): the defaults first, between and last, one
lever the simulator models (max_num_seqs=2 against a load of 4 in flight: a loss), one it accepts
without modelling (fp8 KV: more KV tokens the load does not need), and one it rejects (an unknown
flag: the launch fails). The table has every lever, the rejected one as failed, and the screen
goes on past it; ``report`` writes the same table again from storage."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import optuna
import pytest
from helpers.capacity import BINDING_SLOS
from helpers.cli import main_in_process
from rich.console import Console

from tuner import report, screen, screen_report, screen_resume
from tuner import study as study_mod
from tuner.config import LeverSpec, SpaceConfig, TunerConfig, screen_space
from tuner.screen import DEFAULTS
from tuner.storage import open_study
from tuner.stored_trial import screen_arm

pytestmark = pytest.mark.integration

SMALL = [
    *BINDING_SLOS,
    "mode=screen",
    "tracking=none",
    "workload.num_requests=60",
    "objective.capacity.max_steps=3",  # enough to tell a lever that halves the load (142 s at 4)
    "screen.defaults_every=2",
    # the simulator 10 times faster than the GPU it models, not BINDING_SLOS's 1 (which keeps
    # the host's lag small against the SLOs, for the capacity tests' spreads): what a screen test
    # reads of a capacity is a lever's change far outside the servers' spread (max_num_seqs=2:
    # -74 and -68 %, its interval's high end -0.49, with both cores of this 2-core VM kept busy
    # beside it on 2026-12-07; -81 % at 1). The tiny screen took 60 s at 1, 14 s at 10
    "engine.env.TUNER_SIM_SPEEDUP=10",
]
# which servers run, with which flags, and what they replay besides their search (a screen
# continued over two runs; the eval set), not their capacities
QUICK = [*SMALL, "objective.capacity.max_steps=2", "workload.num_requests=30"]


def _with_levers(cfg: TunerConfig) -> TunerConfig:
    levers = {
        **cfg.screen.levers,
        "mns_2": LeverSpec(param="max_num_seqs", value=2),
        "bogus": LeverSpec(param="no_such_flag", value=1),
    }
    sc = replace(cfg.screen, levers=levers, only=["kv_fp8", "mns_2", "bogus"])
    return replace(cfg, screen=sc, space=screen_space(sc))


def test_a_tiny_screen_on_the_simulator(
    make_cfg: Callable[..., TunerConfig], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _with_levers(make_cfg(*SMALL))
    outcome = study_mod.run(cfg)
    printed = " ".join(capsys.readouterr().out.split())
    assert "simulated (engine=sim)" in printed  # the table is the simulator's reading
    assert "no vision encoder" not in printed  # chat sends no images
    study = outcome.study
    assert study.study_name == "chat-qwen3-8b-sim-capacity-screen"
    arms = [screen_arm(t) for t in study.trials]
    assert arms == [DEFAULTS, "kv_fp8", "mns_2", DEFAULTS, "bogus", DEFAULTS]
    lever_trial = study.trials[2]
    assert "--max-num-seqs" in lever_trial.user_attrs["serve_args"]
    assert "--kv-cache-dtype" not in lever_trial.user_attrs["serve_args"]  # one flag a lever
    assert "changes_numerics" not in lever_trial.user_attrs
    assert study.trials[1].user_attrs["changes_numerics"] == ["kv_cache_dtype=fp8"]

    run_dir = Path(cfg.paths.output_dir)
    data = json.loads((run_dir / "screen.json").read_text())
    rows = {r["lever"]: r for r in data["levers"]}
    assert set(rows) == {"kv_fp8", "mns_2", "bogus"}
    assert len(rows["kv_fp8"]["base"]) == 3
    for name in ("kv_fp8", "mns_2"):
        g = rows[name]["change"]
        assert g["value"] is not None and g["low"] is not None and g["high"] is not None
        assert g["low"] <= g["value"] <= g["high"]
    assert rows["mns_2"]["change"]["value"] < -0.2  # 2 in flight at most, against 4 asked
    assert rows["mns_2"]["word"] == "loss"
    assert rows["kv_fp8"]["numerics"] is True
    # dummy weights: no eval replay, and the record says why
    assert rows["kv_fp8"]["quality"]["status"] == "dummy" and rows["mns_2"]["quality"] is None
    assert not list(run_dir.glob("trial_*/quality.json"))
    assert rows["bogus"]["word"] == "failed" and rows["bogus"]["failures"]
    assert rows["bogus"]["change"]["value"] is None
    assert (run_dir / "screen.csv").is_file() and (run_dir / "screen.html").is_file()

    again = replace(cfg, paths=replace(cfg.paths, output_dir=str(tmp_path / "report")))
    published = report.run_report(again)
    assert {"screen.json", "screen.csv", "screen.html"} <= set(published.files)
    reported = json.loads(published.files["screen.json"].read_text())
    assert reported["levers"] == data["levers"]

    # the same command again: nothing left to run, the table unchanged
    second = study_mod.run(replace(cfg, paths=replace(cfg.paths, output_dir=str(tmp_path / "r2"))))
    assert len(second.study.trials) == len(study.trials)


def test_a_screen_on_real_weights_judges_a_numerics_lever_on_the_eval_set(
    make_cfg: Callable[..., TunerConfig],
) -> None:
    """With real weights (here the simulator as if its weights were real, as in the confirm
    stage's quality test) the defaults' servers and the fp8 KV cache's replay the eval set after
    their capacity search; the simulated fp8 KV cache changes 16 of the first 40 outputs (exact
    match 0.6, as the H200's changed 69 % of all), so under exact match >= 0.7 its row says it
    falls below, in screen.json and in the table."""
    cfg = make_cfg(
        *QUICK,
        "model.load_format=null",
        "screen.only=[kv_fp8,spec_ngram]",
        "confirm.quality.measure=exact_match",
        "confirm.quality.min_agreement=0.7",
        "confirm.quality.limit=40",
    )
    outcome = study_mod.run(cfg)
    arms = [screen_arm(t) for t in outcome.study.trials]
    assert arms == [DEFAULTS, "kv_fp8", "spec_ngram", DEFAULTS]
    run_dir = Path(cfg.paths.output_dir)
    assert len(list(run_dir.glob("trial_*/quality.json"))) == 4
    row, ngram = json.loads((run_dir / "screen.json").read_text())["levers"]
    # n-gram drafts: its servers' acceptance is in the row; its outputs are the defaults' (the
    # simulator changes none for speculative decoding, as the H200 changed none), so it passes
    assert ngram["lever"] == "spec_ngram" and ngram["numerics"] is True
    assert len(ngram["acceptance"]) == 1 and 0 < ngram["acceptance"][0] < 1
    assert ngram["quality"]["agreement"] == pytest.approx(1.0) and ngram["quality"]["passed"]
    assert row["acceptance"] == []
    q = row["quality"]
    assert q["status"] == "measured" and q["changes"] == ["kv_cache_dtype=fp8"]
    assert len(q["rounds"]) == 2 and all(r["n"] == 40 for r in q["rounds"])
    assert q["agreement"] == pytest.approx(0.6) and q["passed"] is False
    csv = (run_dir / "screen.csv").read_text().splitlines()
    assert csv[0].endswith(",quality,quality_passed") and csv[1].endswith(",0.6,False")
    console = Console(width=300, record=True)  # the run's own table wraps at the terminal's
    rows = screen.rows(outcome.study, cfg)
    screen_report.print_table(rows, console)
    assert "quality: exact match 0.60 with vLLM's defaults, below" in console.export_text()
    # the n-gram row's cell (the table may wrap it): its quality and its drafts' acceptance
    cell = screen_report.row_verdict(rows[1])
    assert "exact match 1.00" in cell and f"drafts accepted {ngram['acceptance'][0]:.0%}" in cell


def test_a_stored_screen_goes_on_with_another_lever_of_the_same_flag(
    make_cfg: Callable[..., TunerConfig], tmp_path: Path
) -> None:
    """2026-12-07 on an H100: a stored screen of ``cg_piecewise`` continued with
    ``cg_full_decode_only`` (the same study, the same flag) stopped at its first ask on Optuna's
    "CategoricalDistribution does not support dynamic value space"; now a flag's choices are
    every lever's, and the second run measures its servers."""
    first = make_cfg(*QUICK, "screen.only=[cg_piecewise]")
    study_mod.run(first)
    second = make_cfg(*QUICK, "screen.only=[cg_full_decode_only]")
    outcome = study_mod.run(replace(second, paths=replace(second.paths, output_dir=str(tmp_path))))
    trials = outcome.study.trials
    assert [screen_arm(t) for t in trials] == [
        *(DEFAULTS, "cg_piecewise", DEFAULTS),
        *(DEFAULTS, "cg_full_decode_only", DEFAULTS),
    ]
    assert [t.params["cudagraph_mode"] for t in trials[3:]] == [None, "FULL_DECODE_ONLY", None]
    assert all(t.state.name == "COMPLETE" for t in trials)
    assert "FULL_DECODE_ONLY" in " ".join(trials[4].user_attrs["serve_args"])


def test_a_screen_stored_before_goes_on_where_its_choices_hold_and_says_why_not(
    make_cfg: Callable[..., TunerConfig],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A screen stored before a flag's choices took every lever's value (``cudagraph_mode``:
    ``[None, 'PIECEWISE']``): ``python -m tuner`` with ``cg_full_decode_only`` is refused in
    one line, nothing stored; ``cg_piecewise`` on a second server runs, asked from the stored
    choices."""
    quick = [*QUICK, f"paths.state_dir={tmp_path / 'state'}"]
    old = make_cfg(*quick, "screen.only=[cg_piecewise]")
    spec = replace(old.space.params["cudagraph_mode"], choices=[None, "PIECEWISE"])
    study = study_mod.run(replace(old, space=SpaceConfig(params={"cudagraph_mode": spec}))).study
    assert len(study.trials) == 3
    code, out, err = main_in_process(
        tmp_path,
        *quick,
        "screen.only=[cg_full_decode_only]",
        monkeypatch=monkeypatch,
        capsys=capsys,
    )
    assert code == 2 and "Traceback" not in out + err, err[-3000:]
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert "cudagraph_mode with choices [None, 'PIECEWISE']" in err and "study.name=" in err
    more = make_cfg(*quick, "screen.only=[cg_piecewise]", "screen.servers=2")
    outcome = study_mod.run(replace(more, paths=replace(more.paths, output_dir=str(tmp_path))))
    trials = outcome.study.trials
    assert [screen_arm(t) for t in trials[3:]] == [DEFAULTS, "cg_piecewise", DEFAULTS]
    assert all(t.state.name == "COMPLETE" for t in trials)


def test_waiting_servers_of_a_lever_left_out_of_screen_only_run_with_its_flag(
    make_cfg: Callable[..., TunerConfig], tmp_path: Path
) -> None:
    """A screen of ``kv_fp8`` stopped before its servers ran (all three WAITING), continued with
    ``screen.only=[mns_256]``: the waiting kv_fp8 server ran without ``--kv-cache-dtype`` and
    the waiting defaults' servers with ``max_num_seqs`` sampled, each stored under its arm. Now
    each runs with its arm's flags, and the table has both levers."""
    first = make_cfg(*QUICK, "screen.only=[kv_fp8]")
    screen.prepare(open_study(first), first)  # queued, then the run was stopped
    second = make_cfg(*QUICK, "screen.only=[mns_256]")
    outcome = study_mod.run(replace(second, paths=replace(second.paths, output_dir=str(tmp_path))))
    trials = outcome.study.trials
    arms = [screen_arm(t) for t in trials]
    assert arms == [DEFAULTS, "kv_fp8", DEFAULTS, "mns_256", DEFAULTS]  # no D D back to back
    assert all(t.state.name == "COMPLETE" for t in trials)
    lever = {"kv_fp8": {"kv_cache_dtype": "fp8"}, "mns_256": {"max_num_seqs": 256}}
    none = {"kv_cache_dtype": None, "max_num_seqs": None}
    assert [t.params for t in trials] == [{**none, **lever.get(a or "", {})} for a in arms]
    args = [" ".join(t.user_attrs["serve_args"]) for t in trials]
    assert ["--kv-cache-dtype fp8" in a for a in args] == [a == "kv_fp8" for a in arms]
    assert ["--max-num-seqs" in a for a in args] == [a == "mns_256" for a in arms]
    rows = {r["lever"]: r for r in json.loads((tmp_path / "screen.json").read_text())["levers"]}
    assert set(rows) == {"kv_fp8", "mns_256"}
    assert all(len(r["capacities"]) == 1 and len(r["base"]) == 3 for r in rows.values())


def test_a_round_whose_time_ends_after_a_lever_runs_the_defaults_next(
    make_cfg: Callable[..., TunerConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    """2026-12-07 on an H100: a continued screen's time ended after D P B, and a call of its
    own ran the closing defaults. Now the study loop asks ``last_to_start`` before each ask
    (here told that from the third server on each is the last the time allows): the defaults
    run next, no lever starts after them, and the same command goes on with the queue, which
    kept its own closing defaults."""
    asked: list[int] = []

    def third_is_last(budget: float | None, elapsed: float, durations: list[float]) -> bool:
        asked.append(len(durations))
        assert budget == 3600  # the run's study.timeout_s
        return len(durations) >= 2

    monkeypatch.setattr(screen_resume, "last_to_start", third_is_last)
    cfg = make_cfg(*QUICK, "study.timeout_s=3600", "screen.only=[kv_fp8,mns_256,block_32]")
    study = study_mod.run(cfg).study  # planned: D kv_fp8 mns_256 D block_32 D
    assert asked == [0, 1, 2, 3]  # asked before each ask; the fourth ended the run

    def arms(state: optuna.trial.TrialState) -> list[str | None]:
        trials = study.get_trials(states=(state,))
        trials.sort(key=lambda t: t.datetime_complete or t.datetime_start or t.number)
        return [screen_arm(t) for t in trials]

    assert arms(optuna.trial.TrialState.COMPLETE) == [DEFAULTS, "kv_fp8", DEFAULTS]
    waiting = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert [screen_arm(t) for t in waiting] == ["mns_256", DEFAULTS, "block_32", DEFAULTS]
    monkeypatch.setattr(screen_resume, "last_to_start", lambda *_: False)
    study = study_mod.run(cfg).study
    assert arms(optuna.trial.TrialState.COMPLETE) == [
        *(DEFAULTS, "kv_fp8", DEFAULTS),
        *("mns_256", DEFAULTS, "block_32", DEFAULTS),
    ]
