"""The lever screen's arithmetic, queue, table and figure data (tuner/screen.py,
tuner/screen_report.py, tuner/plots/screen.py, tuner.verdict.gain_of_one), on in-memory studies."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna
import pytest
from rich.console import Console
from scipy import stats

from tuner import screen, screen_report, screen_resume
from tuner.config import TunerConfig, chosen_levers, screen_space
from tuner.engine.argv import command_prefix, flag_args, passed
from tuner.errors import ConfigError
from tuner.plots import screen_data, screen_figure
from tuner.publish import publish
from tuner.records import TrialResult
from tuner.space import defaults, distributions
from tuner.stored_study import pareto_rows, store_names
from tuner.stored_trial import (
    changes_numerics,
    is_baseline,
    machine,
    mark_interrupted,
    screen_arm,
    screen_attrs,
    tell,
)
from tuner.telemetry.gpu import GpuMemory
from tuner.verdict import gain, gain_in_blocks, gain_of_one
from tuner.vllm_rules import numerics_changes

D = screen.DEFAULTS


def trial_argv_words(cfg: TunerConfig, params: dict[str, object]) -> list[str]:
    """The flags a trial with ``params`` passes (as :func:`tuner.engine.argv.build_argv`)."""
    words: list[str] = []
    for name, value in passed(cfg.space, params).items():
        spec = cfg.space.params[name]
        words += flag_args(spec.flag or "--" + name.replace("_", "-"), value)
    return words


# --- the order of the servers -------------------------------------------------------------------


def test_the_defaults_run_first_between_and_last() -> None:
    got = screen.plan(["a", "b", "c", "d", "e"], {n: 1 for n in "abcde"}, 2)
    assert got == [D, "a", "b", D, "c", "d", D, "e", D]
    assert screen.plan(["a", "b"], {"a": 1, "b": 1}, 4) == [D, "a", "b", D]


def test_rounds_alternate_their_order_and_only_needed_levers_run() -> None:
    got = screen.plan(["a", "b", "c"], {"a": 2, "b": 2, "c": 1}, 10)
    assert got == [D, "a", "b", "c", "b", "a", D]
    assert screen.plan(["a", "b"], {}, 2) == []


# --- the arithmetic ------------------------------------------------------------------------------


def test_one_server_against_the_defaults_spread() -> None:
    base = [10.0, 10.6, 9.7, 10.2]
    g = gain_of_one(12.0, base, higher=True)
    logs = [math.log(b) for b in base]
    mean = sum(logs) / len(logs)
    sd = stats.tstd(logs)
    half = stats.t.ppf(0.975, len(base) - 1) * sd * math.sqrt(1 + 1 / len(base))
    d = math.log(12.0) - mean
    assert g.value == pytest.approx(math.exp(d) - 1)
    assert g.low == pytest.approx(math.exp(d - half) - 1)
    assert g.high == pytest.approx(math.exp(d + half) - 1)
    assert (g.n_pick, g.n_base) == (1, 4)
    # more spread in the defaults: a wider interval around the same point
    wide = gain_of_one(12.0, [8.0, 12.0, 9.0, 11.5], higher=True)
    assert wide.high is not None and wide.high - (wide.low or 0) > g.high - (g.low or 0)


def test_one_server_intervals_need_two_defaults_and_use_the_floor() -> None:
    alone = gain_of_one(12.0, [10.0], higher=True)
    assert alone.value == pytest.approx(0.2) and alone.low is None and alone.why
    flat = gain_of_one(12.0, [10.0, 10.0, 10.0], higher=True)
    assert flat.low is None  # no spread and no floor: no interval
    floored = gain_of_one(12.0, [10.0, 10.0, 10.0], higher=True, floor=0.02)
    half = stats.t.ppf(0.975, 2) * 0.02 * math.sqrt(1 + 1 / 3)
    assert floored.low == pytest.approx(1.2 * math.exp(-half) - 1)


def test_several_servers_use_the_confirm_stages_rule() -> None:
    got = screen.change([12.0, 12.5], [10.0, 10.4, 9.9], floor=0.01)
    assert got == gain([12.0, 12.5], [10.0, 10.4, 9.9], higher=True)


# The H100 screen of 2026-12-05 (docs/gpu-runs/2026-12-05-levers-chat-h100-2.md): vLLM's defaults
# on machine A, then on machine B, which read them 12 % higher
H100_A = [58.43, 62.00, 56.19]
H100_B = [65.76, 67.57]


def test_on_two_machines_each_server_is_compared_with_its_own_machines_defaults() -> None:
    base = [("A", c) for c in H100_A] + [("B", c) for c in H100_B]
    pooled = gain_of_one(66.14, H100_A + H100_B, higher=True, floor=0.014)
    blocked = screen.change([("B", 66.14)], base, floor=0.014)
    assert pooled.value == pytest.approx(0.0695, abs=1e-3)  # what the table said before
    assert blocked.value == pytest.approx(66.14 / math.sqrt(65.76 * 67.57) - 1)  # -0.8 %
    assert blocked.low is not None and blocked.high is not None
    assert blocked.low < 0 < blocked.high and (blocked.n_pick, blocked.n_base) == (1, 2)
    # the spread within each machine, pooled (df 2 + 1), replaces the spread across both
    la, lb = [math.log(c) for c in H100_A], [math.log(c) for c in H100_B]
    ss = sum((x - sum(g) / len(g)) ** 2 for g in (la, lb) for x in g)
    half = stats.t.ppf(0.975, 3) * math.sqrt(ss / 3) * math.sqrt(1 + 1 / 2)
    d = math.log(66.14) - sum(lb) / 2
    assert blocked.low == pytest.approx(math.exp(d - half) - 1)
    assert blocked.high == pytest.approx(math.exp(d + half) - 1)
    # a lever measured on machine A against A's three defaults: the same point as alone on A
    on_a = screen.change([("A", 60.87)], base, floor=0.014)
    assert on_a.value == pytest.approx(gain_of_one(60.87, H100_A, higher=True).value)


def test_blocks_reduce_to_one_machine_and_leave_out_a_machine_without_defaults() -> None:
    one = gain_in_blocks([("A", 12.0)], [("A", b) for b in (10.0, 10.6, 9.7)], higher=True)
    assert one == gain_of_one(12.0, [10.0, 10.6, 9.7], higher=True)
    # two servers of the pick, one per machine: each against its machine's mean
    base = [("A", 10.0), ("A", 10.4), ("B", 11.0), ("B", 11.5)]
    two = gain_in_blocks([("A", 11.0), ("B", 12.1)], base, higher=True)
    d = (math.log(11.0 / math.sqrt(10.0 * 10.4)) + math.log(12.1 / math.sqrt(11.0 * 11.5))) / 2
    assert two.value == pytest.approx(math.exp(d) - 1)
    assert (two.n_pick, two.n_base) == (2, 4) and two.low is not None and two.low < two.value
    lost = gain_in_blocks([("A", 11.0), ("C", 30.0)], base, higher=True)
    assert lost.n_pick == 1 and lost.why and "without the defaults" in lost.why
    assert lost.value == pytest.approx(11.0 / math.sqrt(10.0 * 10.4) - 1)
    none = gain_in_blocks([("C", 30.0)], base, higher=True)
    assert none.value is None and none.why and "without the defaults" in none.why
    # one server of each arm per machine: no spread within a machine, no interval
    flat = gain_in_blocks([("B", 12.0)], [("A", 10.0), ("B", 11.0)], higher=True)
    assert flat.value == pytest.approx(12.0 / 11.0 - 1) and flat.low is None and flat.why


def test_rows_compare_within_machines_once_the_servers_ran_on_two(
    screened: tuple[optuna.Study, TunerConfig],
) -> None:
    """As on the H100s: the defaults and kv_fp8 on machine A; mns_256, block_32 and the last
    defaults on machine B, which reads 12 % higher."""
    study, cfg = screened
    _told(study, cfg, 58.43, on="A")  # defaults
    _told(study, cfg, 60.87, on="A")  # kv_fp8
    _told(study, cfg, 66.14, on="B")  # mns_256
    _told(study, cfg, 65.58, on="B")  # block_32
    _told(study, cfg, 65.76, on="B")  # defaults
    assert [machine(t) for t in study.trials] == ["A", "A", "B", "B", "B"]
    rows = {r.lever: r for r in screen.rows(study, cfg)}
    assert rows["mns_256"].change.value == pytest.approx(66.14 / 65.76 - 1)
    assert rows["kv_fp8"].change.value == pytest.approx(60.87 / 58.43 - 1)
    assert all(r.machines == 2 for r in rows.values())
    # pooled, mns_256 read +6 % and was marked for the follow-up; beside its own defaults not
    assert not rows["mns_256"].follow_up
    console = Console(width=220, record=True)
    screen_report.print_table(list(rows.values()), console)
    text = console.export_text()
    assert "2 machines" in text and "its own machine" in text
    (best,) = pareto_rows(study, cfg)  # the Pareto table's "vs baseline": its machine's too
    assert best["capacity_rps_vs_baseline_pct"] == pytest.approx((66.14 / 65.76 - 1) * 100)
    frame = screen_data([r.as_dict() for r in rows.values()]).set_index("lever")
    assert frame.loc["mns_256", "default_servers"] == 1  # machine B's one defaults server
    assert frame.loc["kv_fp8", "default_servers"] == 1
    # trials stored without a machine (before it was recorded) count as one
    study2 = optuna.create_study(directions=["maximize", "minimize"])
    cfg2 = screen.prepare(study2, cfg)
    for c in (58.43, 60.87, 66.14, 65.58, 65.76):
        _told(study2, cfg2, c)
    rows2 = {r.lever: r for r in screen.rows(study2, cfg2)}
    assert rows2["mns_256"].machines == 1
    assert rows2["mns_256"].change.value == pytest.approx(66.14 / math.sqrt(58.43 * 65.76) - 1)


def _defaults_put_first(
    study: optuna.Study, params: dict[str, Any]
) -> list[optuna.trial.FrozenTrial]:
    """The queue after a defaults' server was put before the screened fixture's last three
    (one server more): its waiting trials, each with its arm, baseline mark and fixed flag."""
    waiting = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert [screen_arm(t) for t in waiting] == [D, "mns_256", "block_32", D]
    assert [is_baseline(t) for t in waiting] == [True, False, False, True]
    fixed = [
        {k: v for k, v in t.system_attrs["fixed_params"].items() if v != params[k]} for t in waiting
    ]
    assert fixed == [{}, {"max_num_seqs": 256}, {"block_size": 32}, {}]
    return waiting


def test_a_screen_continued_on_another_machine_runs_the_defaults_there_first(
    screened: tuple[optuna.Study, TunerConfig],
) -> None:
    """2026-12-05: the continued screen ran three levers on a new H100 before its first
    defaults' server there; now the defaults go first (one server more)."""
    study, cfg = screened
    _told(study, cfg, 58.43, on="GPU-a")  # defaults
    _told(study, cfg, 60.87, on="GPU-a")  # kv_fp8; mns_256, block_32 and the defaults wait
    params = defaults(cfg.space)
    assert screen_resume.defaults_first(study, params, "GPU-a") == 0  # the same machine: as queued
    assert screen_resume.defaults_first(study, params, None) == 0  # the simulator: no machine known
    assert screen_resume.defaults_first(study, params, "GPU-b") == 2
    waiting = _defaults_put_first(study, params)
    assert screen_resume.defaults_first(study, params, "GPU-b") == 0  # the defaults are first now
    first = study.ask(distributions(cfg.space))  # Optuna runs the waiting trials in order
    assert screen_arm(first) == D and first.params == waiting[0].system_attrs["fixed_params"]


def test_a_run_whose_time_ends_closes_on_the_defaults(
    screened: tuple[optuna.Study, TunerConfig],
) -> None:
    """2026-12-07: a continued screen's time ended after D P B, and a call of its own ran the
    closing defaults; now, with time for one server more after a lever, the defaults go next,
    and after the defaults no lever starts."""
    study, cfg = screened  # D kv_fp8 mns_256 block_32 D
    params = defaults(cfg.space)
    assert screen_resume.close_round(study, params) is None  # the defaults are next anyway
    _told(study, cfg, 58.4)  # defaults
    assert screen_resume.close_round(study, params) == "end"  # kv_fp8 would end the run
    _told(study, cfg, 60.9)  # kv_fp8; mns_256, block_32 and the defaults wait
    assert screen_resume.close_round(study, params) == "defaults_next"
    _defaults_put_first(study, params)  # the queue the next run continues keeps its own
    assert screen_resume.close_round(study, params) is None  # the defaults are next now
    _told(study, cfg, 59.0)  # Optuna runs the waiting trials in order: the defaults
    done = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert [screen_arm(t) for t in done] == [D, "kv_fp8", D]
    assert screen_resume.close_round(study, params) == "end"
    waiting = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert [screen_arm(t) for t in waiting] == ["mns_256", "block_32", D]  # unchanged


def test_the_last_trial_to_start_is_read_from_the_runs_trials_so_far() -> None:
    assert not screen_resume.last_to_start(300.0, 250.0, [])  # no trial ended yet: no estimate
    assert not screen_resume.last_to_start(None, 250.0, [200.0])  # no study.timeout_s
    assert not screen_resume.last_to_start(
        500.0, 250.0, [200.0]
    )  # 250 + 200 < 500: one more after it
    assert screen_resume.last_to_start(420.0, 250.0, [200.0])  # it ends past the budget: the last
    assert not screen_resume.last_to_start(420.0, 250.0, [200.0, 100.0])  # the mean, 150 s


def test_a_screen_continued_right_after_its_defaults_on_the_same_gpus_starts_with_a_lever(
    screened: tuple[optuna.Study, TunerConfig],
    make_cfg: Callable[..., TunerConfig],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """2026-12-06: a screen ended D qk D on an H100, and the same command with one lever more
    ran another defaults' server there a minute later; now the new lever goes first."""
    study, cfg = screened
    for c in (58.4, 60.9, 59.0, 57.5, 58.8):  # D kv_fp8 mns_256 block_32 D, all on GPU-a
        _told(study, cfg, c, on="GPU-a")
    last = study.trials[-1].datetime_complete
    assert last is not None
    now = last.timestamp() + 60
    assert screen_resume.ended_on_defaults(study, "GPU-a", now) == pytest.approx(60)
    assert (
        screen_resume.ended_on_defaults(study, "GPU-a,GPU-c", now) is not None
    )  # a card in common
    assert screen_resume.ended_on_defaults(study, "GPU-b", now) is None  # another machine
    assert screen_resume.ended_on_defaults(study, None, now) is None  # the simulator
    assert (
        screen_resume.ended_on_defaults(study, "GPU-a", now + screen_resume.SAME_RUN_S) is None
    )  # too old
    more = make_cfg(
        "+workload=chat",
        "mode=screen",
        "tracking=none",
        "screen.only=[kv_fp8,mns_256,block_32,cg_piecewise]",
    )
    monkeypatch.setattr(screen_resume, "here", lambda cfg: "GPU-a")
    screen.prepare(study, more)
    waiting = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert [screen_arm(t) for t in waiting] == ["cg_piecewise", D]
    # on another machine the new servers open with the defaults, as before
    other = optuna.create_study(directions=["maximize", "minimize"])
    cfg2 = screen.prepare(other, cfg)
    for c in (58.4, 60.9, 59.0, 57.5, 58.8):
        _told(other, cfg2, c, on="GPU-a")
    monkeypatch.setattr(screen_resume, "here", lambda cfg: "GPU-b")
    screen.prepare(other, more)
    waiting = other.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert [screen_arm(t) for t in waiting] == [D, "cg_piecewise", D]
    # a last defaults' server that failed: the defaults open the new servers
    third = optuna.create_study(directions=["maximize", "minimize"])
    cfg3 = screen.prepare(third, cfg)
    for c in (58.4, 60.9, 59.0, 57.5, None):
        _told(third, cfg3, c, failure=None if c else "engine_dead", on="GPU-a")
    ended = third.trials[-1].datetime_complete
    assert ended is not None and screen_arm(third.trials[-1]) == D
    assert screen_resume.ended_on_defaults(third, "GPU-a", ended.timestamp() + 60) is None


def test_this_machine_is_its_gpus_uuids_on_real_vllm_only(
    make_cfg: Callable[..., TunerConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    cards = {0: "GPU-a0", 1: "GPU-a1"}
    monkeypatch.setattr(screen_resume, "nvml_available", lambda: True)
    monkeypatch.setattr(
        screen_resume,
        "gpu_memory",
        lambda ix: [GpuMemory(i, 0.0, 80.0, 80.0, "NVIDIA H100", cards[i]) for i in ix],
    )
    assert screen_resume.here(make_cfg("+workload=chat", "engine=vllm", "engine.gpus=[1,0]")) == (
        "GPU-a1,GPU-a0"
    )
    assert screen_resume.here(make_cfg("+workload=chat", "engine=sim")) is None


@pytest.mark.parametrize(
    ("low", "high", "word"),
    [(0.02, 0.1, "gain"), (-0.1, -0.01, "loss"), (-0.05, 0.05, "no significant change")],
)
def test_the_verdict_word_follows_the_interval(low: float, high: float, word: str) -> None:
    g = gain_of_one(1.0, [1.0, 1.0], higher=True)
    assert screen.word(g) == "no interval"
    from tuner.verdict import Gain

    assert screen.word(Gain((low + high) / 2, low, high, 1, 3)) == word
    assert screen.word(Gain(None, why="no server measured it"), failed=True) == "failed"
    zero = screen.change([0.0], [10.0, 10.5], floor=0.01)
    assert zero.value is None and screen.word(zero, zero=True) == "loss"


# --- the stored study ----------------------------------------------------------------------------


def _told(
    study: optuna.Study,
    cfg: TunerConfig,
    capacity: float | None,
    failure: str | None = None,
    on: str | None = None,
) -> None:
    trial = study.ask(distributions(cfg.space))
    metrics = {} if capacity is None else {"capacity_rps": capacity, "ttft_p95_ms": 100.0}
    argv = (*command_prefix(cfg.engine), "m", *trial_argv_words(cfg, dict(trial.params)))
    result = TrialResult(
        trial.number,
        dict(trial.params),
        argv,
        None if capacity is None else (capacity, 100.0),
        {} if capacity is None else {"error_rate": -0.05},
        metrics,
        failure_reason=failure,
        machine=on,
    )
    tell(study, trial, result, cfg, Path("."))


@pytest.fixture
def screened(make_cfg: Callable[..., TunerConfig]) -> tuple[optuna.Study, TunerConfig]:
    cfg = make_cfg(
        "+workload=chat", "mode=screen", "tracking=none", "screen.only=[kv_fp8,mns_256,block_32]"
    )
    study = optuna.create_study(directions=["maximize", "minimize"])
    cfg = screen.prepare(study, cfg)
    return study, cfg


def test_prepare_enqueues_each_lever_once_between_defaults(
    screened: tuple[optuna.Study, TunerConfig],
) -> None:
    study, cfg = screened
    assert cfg.study.n_trials == 5 and cfg.study.max_rejected == 0
    arms = [screen_arm(t) for t in study.trials]
    assert arms == [D, "kv_fp8", "mns_256", "block_32", D]
    fixed = [t.system_attrs["fixed_params"] for t in study.trials]
    assert all(v is None for v in fixed[0].values())
    assert {k: v for k, v in fixed[2].items() if v is not None} == {"max_num_seqs": 256}
    again = screen.prepare(study, cfg)  # resumed: nothing more enqueued
    assert len(study.trials) == 5 and again.study.n_trials == 5


def test_a_flags_choices_are_every_levers_value_whatever_screen_only_says(
    make_cfg: Callable[..., TunerConfig],
) -> None:
    """Optuna keeps a categorical's choices for a study's life: a stored screen continued with
    another lever of the same flag asks from the same choices (2026-12-07: ``cg_piecewise``,
    then ``cg_full_decode_only``, stopped on "CategoricalDistribution does not support dynamic
    value space")."""
    cfg = make_cfg("+workload=chat", "mode=screen", "tracking=none")
    spaces = [
        screen_space(replace(cfg.screen, only=[lever]))
        for lever in ("cg_piecewise", "cg_full_decode_only")
    ]
    assert [list(s.params) for s in spaces] == [["cudagraph_mode"], ["cudagraph_mode"]]
    choices = [s.params["cudagraph_mode"].choices for s in spaces]
    assert choices[0] == choices[1] == [None, "PIECEWISE", "FULL_DECODE_ONLY"]
    assert distributions(spaces[0]) == distributions(spaces[1])


def _stored_with(study: optuna.Study, choices: list[object], value: object) -> None:
    """A screen trial asked from ``choices`` (as a screen stored before its choices took every
    lever's value), told."""
    study.enqueue_trial({"cudagraph_mode": value})
    trial = study.ask({"cudagraph_mode": optuna.distributions.CategoricalDistribution(choices)})
    study.tell(trial, [1.0, 1.0])


def _screen_of(cfg: TunerConfig, *only: str) -> TunerConfig:
    sc = replace(cfg.screen, only=list(only))
    return replace(cfg, screen=sc, space=screen_space(sc))


def test_a_screen_stored_with_narrow_choices_goes_on_where_they_hold_the_new_lever(
    make_cfg: Callable[..., TunerConfig],
) -> None:
    """A screen stored before the choices took every lever's value (``[None, 'PIECEWISE']``):
    a lever whose value is among them runs, asked from the stored choices; one whose value is
    not is refused in one line before anything is enqueued, with the way out."""
    cfg = make_cfg("+workload=chat", "mode=screen", "tracking=none")
    study = optuna.create_study(study_name="s", directions=["maximize", "minimize"])
    _stored_with(study, [None, "PIECEWISE"], "PIECEWISE")
    with pytest.raises(ConfigError) as err:
        screen.prepare(study, _screen_of(cfg, "cg_full_decode_only"))
    text = str(err.value)
    assert "\n" not in text and "cudagraph_mode" in text and "[None, 'PIECEWISE']" in text
    assert "cg_full_decode_only ('FULL_DECODE_ONLY') cannot run" in text
    assert "study.name=s-cg_full_decode_only" in text
    assert len(study.trials) == 1  # nothing enqueued
    piecewise = screen.prepare(study, _screen_of(cfg, "cg_piecewise"))
    assert piecewise.space.params["cudagraph_mode"].choices == [None, "PIECEWISE"]
    asked = [study.ask(distributions(piecewise.space)) for _ in range(piecewise.study.n_trials)]
    assert [screen_arm(t) for t in asked] == [D, "cg_piecewise", D]
    assert [t.params["cudagraph_mode"] for t in asked] == [None, "PIECEWISE", None]
    # stored choices in another order than every lever's: asked in the stored order
    other = optuna.create_study(directions=["maximize", "minimize"])
    _stored_with(other, [None, "FULL_DECODE_ONLY", "PIECEWISE"], None)
    fdo = screen.prepare(other, _screen_of(cfg, "cg_full_decode_only"))
    assert fdo.space.params["cudagraph_mode"].choices == [None, "FULL_DECODE_ONLY", "PIECEWISE"]
    asked = [other.ask(distributions(fdo.space)) for _ in range(fdo.study.n_trials)]
    assert [t.params["cudagraph_mode"] for t in asked] == [None, "FULL_DECODE_ONLY", None]
    # a study that stored the flag as a range (a search under the screen's name): refused too
    ranged = optuna.create_study(directions=["maximize", "minimize"])
    trial = ranged.ask({"max_num_seqs": optuna.distributions.IntDistribution(8, 512)})
    ranged.tell(trial, [1.0, 1.0])
    with pytest.raises(ConfigError, match=r"stores max_num_seqs as IntDistribution.*mns_256"):
        screen.prepare(ranged, _screen_of(cfg, "mns_256"))


def _interrupted_after_its_first_defaults(
    make_cfg: Callable[..., TunerConfig], *only: str
) -> tuple[optuna.Study, TunerConfig]:
    """A screen of ``only`` whose first server (the defaults) ran and whose other servers wait:
    a run stopped after its first trial."""
    cfg = _screen_of(make_cfg("+workload=chat", "mode=screen", "tracking=none"), *only)
    study = optuna.create_study(study_name="s", directions=["maximize", "minimize"])
    first = screen.prepare(study, cfg)
    _told(study, first, 60.0)
    return study, cfg


def test_waiting_servers_of_levers_left_out_of_screen_only_run_with_their_own_flags(
    make_cfg: Callable[..., TunerConfig],
) -> None:
    """Reproduced on the simulator (2026-12-07): a screen of ``kv_fp8`` stopped after its first
    defaults' server, continued with ``screen.only=[mns_256]``: the waiting kv_fp8 server ran
    without ``--kv-cache-dtype`` (its
    param was not in the space: Optuna ignores a fixed param it is not asked) and a waiting
    defaults' server had ``max_num_seqs`` sampled (its fixed params did not name it), both stored
    under their arms. Now the space covers every waiting arm's lever and every waiting server
    asks each param of it at its arm's value (None: vLLM's default, the flag not passed)."""
    study, cfg = _interrupted_after_its_first_defaults(make_cfg, "kv_fp8")
    assert [screen_arm(t) for t in study.trials] == [D, "kv_fp8", D]
    second = screen.prepare(study, _screen_of(cfg, "mns_256"))
    assert set(second.space.params) == {"max_num_seqs", "kv_cache_dtype"}
    assert second.space.params["kv_cache_dtype"].flag is None  # --kv-cache-dtype
    # the two waiting, then mns_256 D: the waiting D opens the new servers (no second D)
    assert second.study.n_trials == 4
    dists = distributions(second.space)
    asked = [study.ask(dists) for _ in range(second.study.n_trials)]
    assert [screen_arm(t) for t in asked] == ["kv_fp8", D, "mns_256", D]
    none = {"max_num_seqs": None, "kv_cache_dtype": None}
    assert [t.params for t in asked] == [
        {**none, "kv_cache_dtype": "fp8"},
        none,
        {**none, "max_num_seqs": 256},
        none,
    ]
    assert trial_argv_words(second, dict(asked[0].params)) == ["--kv-cache-dtype", "fp8"]
    for t in asked:
        study.tell(t, [50.0, 100.0])
    # the table: the lever left out of screen.only is measured and shown as any other
    rows = {r.lever: r for r in screen.rows(study, second)}
    assert set(rows) == {"kv_fp8", "mns_256"}
    assert rows["kv_fp8"].flag == "--kv-cache-dtype fp8" and rows["kv_fp8"].word != "not run yet"


def test_a_defaults_server_waiting_last_opens_the_new_servers(
    make_cfg: Callable[..., TunerConfig],
) -> None:
    """A defaults' server queued last by an earlier run is the new servers' opening one: no two
    defaults' servers back to back (each costs a vLLM start and a capacity search); a queue that
    ends with a lever still gets the plan's own opening defaults."""
    study, cfg = _interrupted_after_its_first_defaults(make_cfg, "kv_fp8")  # waiting: kv_fp8, D
    after_d = screen.prepare(study, _screen_of(cfg, "mns_256"))
    waiting = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert [screen_arm(t) for t in waiting] == ["kv_fp8", D, "mns_256", D]
    assert after_d.study.n_trials == 4
    ends_on_lever = optuna.create_study(study_name="l", directions=["maximize", "minimize"])
    ends_on_lever.enqueue_trial({"kv_cache_dtype": "fp8"}, user_attrs=screen_attrs("kv_fp8", False))
    screen.prepare(ends_on_lever, _screen_of(cfg, "mns_256"))
    waiting = ends_on_lever.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert [screen_arm(t) for t in waiting] == ["kv_fp8", D, "mns_256", D]


def test_a_waiting_server_of_a_lever_gone_from_the_catalogue_is_refused_in_one_line(
    make_cfg: Callable[..., TunerConfig],
) -> None:
    study, cfg = _interrupted_after_its_first_defaults(make_cfg, "kv_fp8")
    levers = {n: lever for n, lever in cfg.screen.levers.items() if n != "kv_fp8"}
    gone = replace(cfg, screen=replace(cfg.screen, levers=levers))
    with pytest.raises(ConfigError) as err:
        screen.prepare(study, _screen_of(gone, "mns_256"))
    text = str(err.value)
    assert "\n" not in text and "kv_fp8" in text and "screen.levers" in text
    assert "+screen.levers.kv_fp8={param:kv_cache_dtype,value:fp8}" in text
    assert len(study.trials) == 3  # nothing enqueued
    # a lever whose value changed since its server was queued: refused too
    kv = replace(cfg.screen.levers["kv_fp8"], value="fp8_e5m2")
    moved = replace(cfg, screen=replace(cfg.screen, levers={**cfg.screen.levers, "kv_fp8": kv}))
    with pytest.raises(ConfigError, match=r"kv_fp8.*'fp8'.*'fp8_e5m2'"):
        screen.prepare(study, _screen_of(moved, "mns_256"))
    assert len(study.trials) == 3
    # a waiting server whose value the study's stored choices lack (queued by a run that
    # stopped at its ask): refused, not Optuna's traceback at the ask
    cfg = make_cfg("+workload=chat", "mode=screen", "tracking=none")
    narrow = optuna.create_study(study_name="n", directions=["maximize", "minimize"])
    _stored_with(narrow, [None, "PIECEWISE"], "PIECEWISE")
    narrow.enqueue_trial(
        {"cudagraph_mode": "FULL_DECODE_ONLY"},
        user_attrs=screen_attrs("cg_full_decode_only", False),
    )
    with pytest.raises(ConfigError, match=r"cg_full_decode_only \('FULL_DECODE_ONLY', queued"):
        screen.prepare(narrow, _screen_of(cfg, "cg_piecewise"))
    assert len(narrow.trials) == 2


def test_rows_show_changes_failures_and_interruptions(
    screened: tuple[optuna.Study, TunerConfig],
) -> None:
    study, cfg = screened
    _told(study, cfg, 10.0)  # defaults
    _told(study, cfg, 13.0)  # kv_fp8
    _told(study, cfg, None, failure="launch_failed")  # mns_256
    running = study.ask(distributions(cfg.space))  # block_32, interrupted
    mark_interrupted(study, running, "Ctrl-C")
    _told(study, cfg, 10.4)  # defaults
    assert changes_numerics(study.trials[1]) == ["kv_cache_dtype=fp8"]
    assert changes_numerics(study.trials[0]) == []
    rows = {r.lever: r for r in screen.rows(study, cfg)}
    assert list(rows) == ["kv_fp8", "mns_256", "block_32"]
    kv = rows["kv_fp8"]
    assert kv.capacities == (13.0,) and kv.base == (10.0, 10.4) and kv.numerics
    assert kv.change.value == pytest.approx(13.0 / math.sqrt(10.0 * 10.4) - 1)
    assert kv.change.low is not None and kv.change.high is not None
    assert kv.follow_up and screen_report.follow_up(list(rows.values())) == ["kv_fp8"]
    assert rows["mns_256"].word == "failed" and rows["mns_256"].failures == ("launch_failed",)
    assert rows["block_32"].word == "failed" and rows["block_32"].failures == ("interrupted",)
    # the interrupted lever runs again with the same command, between defaults
    again = screen.prepare(study, cfg)
    assert [screen_arm(t) for t in study.trials[5:]] == [D, "block_32", D]
    assert again.study.n_trials == 3


def test_table_json_metrics_and_figure_data(
    screened: tuple[optuna.Study, TunerConfig], tmp_path: Path
) -> None:
    study, cfg = screened
    for capacity in (10.0, 9.0, None, 10.0, 10.2):
        _told(study, cfg, capacity, failure=None if capacity else "launch_failed")
    rows = screen.rows(study, cfg)
    console = Console(width=200, record=True)
    screen_report.print_table(rows, console)
    text = console.export_text()
    for r in rows:
        assert r.lever in text
    assert "launch_failed" in text
    path = screen_report.write_json(rows, tmp_path)
    assert path.name == "screen.json" and "kv_fp8" in path.read_text()
    m = screen_report.metrics(rows)
    assert m["screen_kv_fp8_change"] == pytest.approx(rows[0].change.value)
    assert "screen_mns_256_change" not in m
    frame = screen_data([r.as_dict() for r in rows])
    assert list(frame["lever"]) == ["kv_fp8", "mns_256", "block_32"]
    first = frame.iloc[0]
    assert first["change_pct"] == pytest.approx(100 * rows[0].change.value)
    assert first["low_pct"] == pytest.approx(100 * (rows[0].change.low or 0))
    assert first["servers"] == 1 and first["default_servers"] == 2
    fig = screen_figure(frame, "t")
    names = {tr.name for tr in fig.data}
    assert names == {rows[0].word, "failed"}


def test_three_servers_a_side_decide_and_a_numerics_gain_points_to_quality(
    make_cfg: Callable[..., TunerConfig],
) -> None:
    """The H200's fp8-weights follow-up (docs/gpu-runs/2026-12-02-screen-fp8-3x3.md): 3 + 3
    servers give the verdict, so the lever is no longer marked for a follow-up; its gain changes
    numerics, so the table sends the operator to the quality check instead."""
    cfg = make_cfg(
        "+workload=chat",
        "mode=screen",
        "tracking=none",
        "screen.only=[kv_fp8]",
        "screen.servers=3",
        "screen.defaults_every=2",
    )
    study = optuna.create_study(directions=["maximize", "minimize"])
    cfg = screen.prepare(study, cfg)
    arms = [screen_arm(t) for t in study.trials]
    assert arms == [D, "kv_fp8", "kv_fp8", D, "kv_fp8", D]  # as on the H200
    caps = {D: [67.33, 66.33, 66.38], "kv_fp8": [78.13, 79.47, 78.13]}
    for arm in arms:
        _told(study, cfg, caps[arm].pop(0))
    (row,) = screen.rows(study, cfg)
    assert row.word == "gain" and row.numerics and len(row.capacities) == 3
    assert row.change.value == pytest.approx(0.1784, abs=1e-3)
    assert row.change.low == pytest.approx(0.1540, abs=1e-3)
    assert not row.follow_up and screen_report.follow_up([row]) == []
    console = Console(width=220, record=True)
    screen_report.print_table([row], console)
    text = console.export_text()
    assert "gain → check quality" in text and "follow up" not in text


def test_a_screen_needs_known_levers_and_the_capacity_objective(
    make_cfg: Callable[..., TunerConfig],
) -> None:
    with pytest.raises(ConfigError, match="screen.only"):
        make_cfg("+workload=chat", "mode=screen", "screen.only=[nope]")
    with pytest.raises(ConfigError, match="capacity_rps"):
        make_cfg("+workload=chat", "mode=screen", "objective=throughput")


def test_every_default_lever_is_a_valid_one_flag_trial(
    make_cfg: Callable[..., TunerConfig],
) -> None:
    cfg = make_cfg("+workload=chat", "mode=screen", "model.load_format=null")  # real weights
    assert len(cfg.screen.levers) >= 10
    for name, lever in cfg.screen.levers.items():
        assert lever.enabled and lever.changes and lever.source.startswith("vllm/"), name
        spec = cfg.space.params[lever.param]
        assert spec.default is None and lever.value in (spec.choices or [])
    # which change numerics is vllm_rules.NUMERICS' to say (the quality guard reads it too)
    numerics = {n for n, lv in cfg.screen.levers.items() if numerics_changes({lv.param: lv.value})}
    assert numerics == {"quant_fp8", "kv_fp8", "spec_ngram"}


def test_speculative_decoding_is_screened_on_real_weights_only(
    make_cfg: Callable[..., TunerConfig], caplog: pytest.LogCaptureFixture
) -> None:
    """On dummy weights the n-gram lever is left out with a log line (its gain is the drafts'
    acceptance), and refused in one line when ``screen.only`` names it."""
    with caplog.at_level(logging.INFO, logger="tuner.space"):
        cfg = make_cfg("+workload=chat", "mode=screen")
    assert not cfg.screen.levers["spec_ngram"].enabled
    assert "spec_ngram" not in chosen_levers(cfg.screen)
    assert "speculative_config" not in cfg.space.params
    assert "spec_ngram not screened" in caplog.text and "dummy weights" in caplog.text
    with pytest.raises(ConfigError, match=r"spec_ngram.*real weights.*smollm2-135m"):
        make_cfg("+workload=chat", "mode=screen", "screen.only=[spec_ngram,kv_fp8]")
    real = make_cfg("+workload=chat", "mode=screen", "model.load_format=null")
    assert "spec_ngram" in chosen_levers(real.screen)


def test_every_lever_is_a_vllm_0_24_flag_the_simulator_accepts_and_the_doc_lists(
    make_cfg: Callable[..., TunerConfig],
) -> None:
    import json

    from tuner.engine.argv import flag_args
    from tuner.sim.cli import parse_args
    from tuner.space import flag_name

    root = Path(__file__).resolve().parents[2]
    dump = json.loads((root / "tests/data/vllm-0.24.0-serve-flags.json").read_text())["options"]
    doc = (root / "docs/levers.md").read_text()
    cfg = make_cfg("+workload=chat", "mode=screen", "model.load_format=null")  # every lever
    for name, lever in cfg.screen.levers.items():
        words = flag_args(flag_name(lever.param, cfg.space.params[lever.param]), lever.value)
        option = words[0].split("=")[0].split(".")[0]
        assert option in dump, (name, option)
        assert dump[option]["dest"] in (lever.param, "compilation_config"), name
        parsed = parse_args(["serve", "m", *words])  # exits 2 on a flag it does not know
        assert parsed.user_set, name
        assert f"`{name}`" in doc and " ".join(words) in doc, name


def test_a_search_trial_that_passes_fp8_kv_records_it(
    make_cfg: Callable[..., TunerConfig],
) -> None:
    from tuner.space import defaults

    cfg = make_cfg("+workload=chat")
    study = optuna.create_study(directions=["maximize", "minimize"])
    study.enqueue_trial({**defaults(cfg.space), "kv_cache_dtype": "fp8"})
    study.enqueue_trial(defaults(cfg.space))
    _told(study, cfg, 10.0)
    _told(study, cfg, 10.0)
    assert changes_numerics(study.trials[0]) == ["kv_cache_dtype=fp8"]
    assert changes_numerics(study.trials[1]) == []


def test_an_export_of_a_config_that_changes_numerics_says_so(
    make_cfg: Callable[..., TunerConfig], tmp_path: Path
) -> None:
    from tuner.space import defaults
    from tuner.tracking import NullTracker

    cfg = make_cfg("+workload=chat", "tracking=none", "confirm.picks=[latency,baseline]")
    study = optuna.create_study(directions=["maximize", "minimize"])
    study.enqueue_trial(defaults(cfg.space), user_attrs={"baseline": True})
    study.enqueue_trial({**defaults(cfg.space), "kv_cache_dtype": "fp8"})
    _told(study, cfg, 10.0)
    trial = study.ask(distributions(cfg.space))  # fp8 KV: the lowest TTFT, the latency pick
    argv = (*command_prefix(cfg.engine), "m", *trial_argv_words(cfg, dict(trial.params)))
    metrics = {"output_throughput": 10.0, "ttft_p95_ms": 50.0}
    result = TrialResult(
        trial.number, trial.params, argv, (10.0, 50.0), {"error_rate": -1}, metrics
    )
    tell(study, trial, result, cfg, tmp_path)
    publish(study, cfg, tmp_path, NullTracker(), Console(width=160, record=True))
    latency = (tmp_path / "best-latency.yaml").read_text()
    assert any(ln.startswith("kv-cache-dtype") and "fp8" in ln for ln in latency.splitlines())
    assert "changes numerics (kv_cache_dtype=fp8)" in latency
    assert "changes numerics" not in (tmp_path / "best-baseline.yaml").read_text()


def test_report_reads_the_floor_the_study_was_measured_with(
    make_cfg: Callable[..., TunerConfig],
) -> None:
    """The long_docs screen of 2026-12-06 ran with ``objective.capacity.rel_width=0.1``; its
    ``report`` without that override gave +5.9 … +23.1 % against the run's +4.2 … +25.1 %. The
    interval's floor now comes from the study (docs/gpu-runs/2026-12-06-long-docs-kv-h100-4.md)."""
    opts = ("+workload=long_docs", "mode=screen", "tracking=none", "screen.only=[kv_fp8]")
    ran = make_cfg(
        *opts, "screen.servers=4", "screen.defaults_every=1", "objective.capacity.rel_width=0.1"
    )
    study = optuna.create_study(directions=["maximize", "minimize"])
    ran = screen.prepare(study, ran)
    store_names(study, ran)
    caps = {  # the four H100s' servers, each with its machine
        D: [("A", 1.020), ("B", 0.966), ("C", 0.963), ("E", 0.975), ("E", 0.972)],
        "kv_fp8": [("A", 1.119), ("B", 1.154), ("B", 1.103), ("E", 1.107)],
    }
    for t in list(study.get_trials(states=(optuna.trial.TrialState.WAITING,))):
        on, c = caps[str(screen_arm(t))].pop(0)
        _told(study, ran, c, on=on)
    assert caps == {D: [], "kv_fp8": []}  # every server of the run was told
    (live,) = screen.rows(study, ran)
    later = make_cfg(*opts)  # the report's command, without the run's override
    assert later.objective.capacity.rel_width != ran.objective.capacity.rel_width
    (again,) = screen.rows(study, later)
    assert live.change.low == pytest.approx(0.042, abs=2e-3)
    assert live.change.high == pytest.approx(0.251, abs=2e-3)
    assert (again.change.low, again.change.high) == (live.change.low, live.change.high)
    study.set_user_attr("capacity_rel_width", None)  # a study stored before it was recorded
    (old,) = screen.rows(study, later)
    assert old.change.low == pytest.approx(0.059, abs=2e-3)  # the config's 0.05 then


def test_a_screen_on_the_simulator_says_it_and_its_blind_spot_with_images() -> None:
    text = screen_report.simulated_note(images=False)
    assert "engine=vllm" in text and "vision encoder" not in text
    # image_heavy on an H100: fp8 weights +0.6 % where the simulator read +31.6 %
    assert "+31.6 %" in screen_report.simulated_note(images=True)


def test_a_layout_screen_compares_capacity_per_gpu(make_cfg: Callable[..., TunerConfig]) -> None:
    # issue #33: TP=2 and DP=2 against one GPU, at equal hardware (objective=capacity_per_gpu)
    cfg = make_cfg(
        "+workload=chat",
        "mode=screen",
        "screen=layouts",
        "objective=capacity_per_gpu",
        "engine.gpus=[0,1]",
        "tracking=none",
        "screen.servers=1",
    )
    study = optuna.create_study(directions=["maximize", "minimize"])
    store_names(study, cfg)
    cfg = screen.prepare(study, cfg)
    arms = [screen_arm(t) for t in study.trials]
    assert arms == [D, "tp_2", "dp_2", D]
    per_server = {D: [68.0, 70.0], "tp_2": [72.0], "dp_2": [130.0]}  # req/s of the whole server
    for arm in arms:
        trial = study.ask(distributions(cfg.space))
        rps = per_server[arm].pop(0)
        per_gpu = rps / (1 if arm == D else 2)
        metrics = {"capacity_rps": rps, "capacity_per_gpu_rps": per_gpu, "ttft_p95_ms": 100.0}
        argv = (*command_prefix(cfg.engine), "m", *trial_argv_words(cfg, dict(trial.params)))
        result = TrialResult(trial.number, dict(trial.params), argv, (per_gpu, 100.0), {}, metrics)
        tell(study, trial, result, cfg, Path("."))
    rows = {r.lever: r for r in screen.rows(study, cfg)}
    assert rows["tp_2"].capacities == (36.0,) and rows["dp_2"].capacities == (65.0,)
    assert rows["tp_2"].base == (68.0, 70.0) and rows["tp_2"].word == "loss"
    assert rows["dp_2"].change.value == pytest.approx(65.0 / math.sqrt(68.0 * 70.0) - 1)
    assert {r.metric for r in rows.values()} == {"capacity_per_gpu_rps"}
    assert rows["dp_2"].server_rps == (130.0,)  # the server's own rate beside its rate per GPU
    # a report that opens the study by name, without objective=: the study says what it compared
    plain = make_cfg("+workload=chat", "mode=screen", "screen=layouts", "tracking=none")
    assert screen.screen_metric(study, plain) == "capacity_per_gpu_rps"
    console = Console(width=200, record=True)
    screen_report.print_table(list(rows.values()), console)
    text = console.export_text()
    assert "SLO capacity per GPU" in text and "req/s a server" in text and "130" in text
    with pytest.raises(ConfigError, match="capacity_per_gpu_rps"):
        make_cfg("+workload=chat", "mode=screen", "objective=throughput")


def test_every_layout_lever_is_a_vllm_0_24_flag_the_simulator_accepts(
    make_cfg: Callable[..., TunerConfig],
) -> None:
    import json

    from tuner.sim.cli import parse_args
    from tuner.space import flag_name

    root = Path(__file__).resolve().parents[2]
    dump = json.loads((root / "tests/data/vllm-0.24.0-serve-flags.json").read_text())["options"]
    cfg = make_cfg("+workload=chat", "mode=screen", "screen=layouts")
    assert set(cfg.screen.levers) == {"tp_2", "dp_2"}
    for name, lever in cfg.screen.levers.items():
        words = flag_args(flag_name(lever.param, cfg.space.params[lever.param]), lever.value)
        assert dump[words[0]]["dest"] == lever.param, name
        assert parse_args(["serve", "m", *words]).user_set, name
