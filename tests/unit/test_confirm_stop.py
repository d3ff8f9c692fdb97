"""``confirm.stop_losers``: from the third round on, a pick whose gain over vLLM's defaults
settled below ``confirm.min_effect`` (beyond the spread between rounds) runs no more rounds; the
defaults run them all unless every pick stopped. The confirm loop of :mod:`tuner.confirm_stage` with
three candidates and ``run_server`` replaced by one that returns the verdict's metric per
server: one pick reads half the defaults' value, the other +6 % then -4 % (an interval that
still reaches +3 %), or the same as the defaults (one that does not)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pytest

import tuner.confirm_stage as confirm_stage
from tuner.config import TunerConfig
from tuner.deadline import Deadline
from tuner.memory import ModelShape
from tuner.records import Candidate, TrialResult
from tuner.trial import TrialContext

LOSER, TIE, BASE = 4, 7, 0
CANDIDATES = [
    Candidate(LOSER, ("throughput",), {"max_num_seqs": 16}, False, (), {}),
    Candidate(TIE, ("latency",), {"max_num_seqs": 512}, False, (), {}),
    Candidate(BASE, ("baseline",), {}, True, (), {}),
]


def _confirm(
    cfg: TunerConfig,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    tie: bool = False,
    values: dict[int, list[float]] | None = None,
) -> tuple[list[int], list[Any]]:
    """The confirm loop over :data:`CANDIDATES`, or over ``values``' trials (each its value per
    round, the defaults' trial :data:`BASE`)."""
    metric = cfg.objective.objectives[0].metric
    started: list[int] = []

    async def fake_run_server(ctx: Any, trial: int, *args: Any, **kwargs: Any) -> list[Any]:
        started.append(trial)
        k = started.count(trial)
        value = 1000.0 + (1.0 if tie else 10.0) * k
        if values is not None:
            value = values[trial][k - 1]
        elif trial == LOSER:
            value /= 2
        elif trial == TIE and not tie:  # +6 % then -4 %: its interval still reaches +3 %
            value *= {1: 1.06, 2: 0.96}.get(k, 1.0)
        return [TrialResult(trial, {}, (), (value,), {}, {metric: value}, launched=True)]

    monkeypatch.setattr(confirm_stage, "run_server", fake_run_server)
    monkeypatch.setattr(confirm_stage, "build_requests", lambda w, files: [])
    ctx = TrialContext(cfg, ModelShape.from_dir(cfg.model.files), [], [], tmp_path / "run", None)
    study = optuna.create_study(directions=["maximize"])
    cands = CANDIDATES
    if values is not None:
        cands = [Candidate(t, ("baseline" if t == BASE else f"pick {t}",), {}, t == BASE, (), {})
                 for t in values]  # fmt: skip
    out = asyncio.run(confirm_stage.run_confirm(study, ctx, cands, Deadline()))
    return started, out


@pytest.mark.parametrize("stop", [True, False])
def test_a_pick_below_the_defaults_after_two_rounds_runs_no_third(
    stop: bool,
    make_cfg: Callable[..., TunerConfig],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    cfg = make_cfg(
        "+workload=chat",
        "objective=throughput",
        "confirm.rounds=3",
        f"confirm.stop_losers={str(stop).lower()}",
    )
    with caplog.at_level(logging.INFO, logger="tuner"):
        started, results = _confirm(cfg, tmp_path, monkeypatch)
    assert started.count(LOSER) == (2 if stop else 3)
    assert started.count(TIE) == 3 and started.count(BASE) == 3
    rounds = {r.trial: sorted({row["round"] for row in r.runs}) for r in results}
    assert rounds == {LOSER: [1, 2] if stop else [1, 2, 3], TIE: [1, 2, 3], BASE: [1, 2, 3]}
    skipped = [r.getMessage() for r in caplog.records if "not run, nor its" in r.getMessage()]
    assert len(skipped) == (1 if stop else 0)
    if stop:
        assert f"round 3, trial {LOSER} (throughput)" in skipped[0]
        assert "after 2 and 2 rounds" in skipped[0] and "−50." in skipped[0]
    assert all(r.passed for r in results)  # a pick stopped as a loser is not demoted for it
    # the confirm table says why it has fewer rounds
    from rich.console import Console

    from tuner.confirm import verdict
    from tuner.console import print_confirm

    decided = verdict(results, CANDIDATES, cfg.objective, cfg.confirm.min_effect, 3)
    console = Console(record=True, width=300)
    print_confirm(results, CANDIDATES, None, tmp_path, console, ["throughput"], decided)
    table = console.export_text()
    assert ("settled after 2 rounds: no more (confirm.stop_losers)" in table) is stop
    loser_row = next(line for line in table.splitlines() if line.startswith(f"│ {LOSER} "))
    assert ("2/2" if stop else "3/3") in loser_row


def test_a_tie_stops_too_and_then_the_defaults(
    make_cfg: Callable[..., TunerConfig],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A pick level with the defaults round for round (0.1 % apart by round: an interval of
    ±0.3 %) cannot reach confirm.min_effect (+3 %): after 2 rounds it stops as the loser does,
    and with no pick left the defaults stop too."""
    cfg = make_cfg("+workload=chat", "objective=throughput", "confirm.rounds=3")
    with caplog.at_level(logging.INFO, logger="tuner"):
        started, results = _confirm(cfg, tmp_path, monkeypatch, tie=True)
    assert started.count(LOSER) == started.count(TIE) == started.count(BASE) == 2
    lines = [r.getMessage() for r in caplog.records if "not run, nor its" in r.getMessage()]
    assert any(
        f"trial {TIE} (latency)" in m and "short of confirm.min_effect (+3%)" in m for m in lines
    )
    assert any(f"trial {BASE} (baseline)" in m and "every pick has stopped" in m for m in lines)
    from tuner.confirm import verdict

    decided = verdict(results, CANDIDATES, cfg.objective, cfg.confirm.min_effect, 3)
    assert decided.recommended == BASE  # no gain claimed: keep the defaults


def test_the_other_picks_spread_settles_a_noisy_pick(
    make_cfg: Callable[..., TunerConfig],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A pick 3.3 % below the defaults whose two servers read 4 % apart: on its and the
    defaults' rounds alone its interval reaches +5.8 %; with the steady pick's (+2 %, 0.5 %
    apart) it reaches +2.1 %, short of confirm.min_effect, so it runs no third round. The steady
    pick's interval (up to +7.7 %) still reaches +3 %: it and the defaults run all three."""
    noisy, steady = 5, 8
    values = {
        noisy: [950.0, 990.0, 1.0],
        steady: [1020.0, 1025.0, 1022.0],
        BASE: [1000.0, 1005.0, 1002.0],
    }
    cfg = make_cfg("+workload=chat", "objective=throughput", "confirm.rounds=3")
    with caplog.at_level(logging.INFO, logger="tuner"):
        started, _ = _confirm(cfg, tmp_path, monkeypatch, values=values)
    assert (started.count(noisy), started.count(steady), started.count(BASE)) == (2, 3, 3)
    lines = [r.getMessage() for r in caplog.records if "not run, nor its" in r.getMessage()]
    assert len(lines) == 1 and f"trial {noisy} (pick {noisy})" in lines[0]
    assert "short of confirm.min_effect (+3%)" in lines[0] and "+2.1 %" in lines[0]
    assert "the spread pooled over the stage's 3 configs" in lines[0]


@pytest.mark.parametrize("stop", [True, False])
def test_a_gain_settled_above_min_effect_after_two_rounds_ends_the_stage(
    stop: bool,
    make_cfg: Callable[..., TunerConfig],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``confirm.stop_winner``: a pick +30 % over the defaults on both of its first two servers
    (0.5 % apart; Welch's interval after 2 + 2 rounds about +25 … +35 %, wholly above +3 %) is a
    settled gain: no candidate runs the third round, and the verdict on the 2 + 2 rounds claims
    it (``stop_losers`` off: it would stop the second pick, +2 %, on its own)."""
    fast, near = 5, 8
    values = {
        fast: [1300.0, 1306.0, 1303.0],
        near: [1020.0, 1025.0, 1022.0],
        BASE: [1000.0, 1005.0, 1002.0],
    }
    cfg = make_cfg(
        "+workload=chat",
        "objective=throughput",
        "confirm.rounds=3",
        "confirm.stop_losers=false",
        f"confirm.stop_winner={str(stop).lower()}",
    )
    with caplog.at_level(logging.INFO, logger="tuner"):
        started, results = _confirm(cfg, tmp_path, monkeypatch, values=values)
    n = 2 if stop else 3
    assert (started.count(fast), started.count(near), started.count(BASE)) == (n, n, n)
    lines = [r.getMessage() for r in caplog.records if "confirm.stop_winner" in r.getMessage()]
    assert len(lines) == (1 if stop else 0)
    if stop:
        assert f"no candidate runs round 3 or later: after 2 rounds trial {fast}" in lines[0]
        assert "+30." in lines[0]
    from rich.console import Console

    from tuner.confirm import verdict
    from tuner.console import print_confirm
    from tuner.records import Candidate

    cands = [Candidate(t, ("baseline" if t == BASE else f"pick {t}",), {}, t == BASE, (), {})
             for t in values]  # fmt: skip
    decided = verdict(results, cands, cfg.objective, cfg.confirm.min_effect, 3)
    assert decided.kind == "gain" and decided.recommended == fast
    g = decided.gains[fast]
    assert (g.n_pick, g.n_base) == (n, n) and g.low is not None and g.low > 0.2
    console = Console(record=True, width=300)
    print_confirm(results, cands, None, tmp_path, console, [], decided)
    table = console.export_text()
    said = "the gain settled after 2 rounds: no more (confirm.stop_winner)"
    assert table.count(said) == (3 if stop else 0)


@pytest.mark.parametrize(
    ("fast", "other"),
    [
        # claimed (interval above 0, point +5 %) but its interval reaches below +3 %
        ([1040.0, 1062.0, 1050.0], [1000.0, 1004.0, 1002.0]),
        # settled above +3 %, but another pick measured a higher point gain (+40 %, unclaimed:
        # 1,200 then 1,600): a third round could make it the recommended one
        ([1300.0, 1306.0, 1303.0], [1200.0, 1600.0, 1400.0]),
    ],
)
def test_no_stop_on_a_gain_not_yet_settled(
    fast: list[float],
    other: list[float],
    make_cfg: Callable[..., TunerConfig],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    values = {5: fast, 8: other, BASE: [1000.0, 1005.0, 1002.0]}
    cfg = make_cfg(
        "+workload=chat", "objective=throughput", "confirm.rounds=3", "confirm.stop_losers=false"
    )
    started, _ = _confirm(cfg, tmp_path, monkeypatch, values=values)
    assert (started.count(5), started.count(8), started.count(BASE)) == (3, 3, 3)
