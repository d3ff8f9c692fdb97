"""What an SLO capacity study costs with and without the incumbent probe (issue #29, item 6).

Usage::

    python benchmarks/capacity_cost.py [--trials 20] [--seed 0] [--preset small] [--out PATH]
        [--timeout-s S] [-- TUNER OVERRIDES...]

Runs two studies one after the other, each in a fresh temporary folder, with the same sampler
seed; only ``objective.capacity.incumbent_probe`` differs::

    python -m tuner +workload=chat engine=sim objective=capacity study.n_trials=N study.seed=S \\
        tracking=none confirm.enabled=false objective.capacity.incumbent_probe=false|true \\
        [PRESET] [OVERRIDES...]

``--preset small`` adds the overrides of :data:`PRESETS` (before yours, so yours win): the same
chat workload scaled down so that its SLOs bind at a few requests/s (100 requests of 16–32 output
tokens at 4 in flight, TPOT 20 ms, TTFT 4 s, the simulated engine at half speed: capacity near 17
in flight, ``tests/helpers/capacity.py``'s ``BINDING_SLOS``), each step a cheap replay, at most 6
replays a trial. The full-size chat takes 10–30 minutes a study on 2 cores; the small preset's
3-trial studies took 145 s (probe off) and 84 s (on) on the shared 2-core machine.

Read back from each study's Optuna storage (:mod:`tuner.stored_trial`,
:mod:`tuner.stored_study`), per study:

- **replays** of a trial: its ``capacity_steps``, every replay its capacity search ran on the
  trial's server, the workload's own load (the first) included. **Extra replays**:
  ``capacity_steps − 1``, the replays beyond the workload's own, which a study runs under any
  objective; the incumbent probe's replay is one of them (a trial that lost at the incumbent's
  load has 1, or 0 when it lost at its own load already, below the incumbent's). The targets
  are on extra replays. Medians over the trials with a capacity search: all of them, the
  **losing** trials (``capacity_censored == -1``: the probe lost and the trial ended there, its
  capacity censored above) and the others apart. A trial without ``capacity_steps`` (pruned at
  the workload's own load, a failed start-up) is in no median; the JSON counts them.
- **GPU-seconds per counted trial**: the sum of the trials' ``server_s`` (the seconds a server
  was held: start-up, replays and stop; on the simulator, simulated GPU time) over the trials
  that count toward ``study.n_trials`` (:func:`tuner.stored_trial.counted`), divided by their
  number.
- **wall time** of the study: the ``python -m tuner`` process, start to exit.
- **best capacity**: :func:`tuner.stored_study.incumbent_capacity`, the highest ``capacity_rps``
  measured by a feasible trial not censored above; and the probe study's relative difference
  ``(probe − without) / without``. Both studies run vLLM's defaults first (no incumbent yet),
  so their two capacities of the same config (``baseline_capacity_rps``) show the spread between
  fresh servers that this difference includes.

Targets, on the study with the probe: median extra replays per losing trial ≤ 1.5; median extra
replays per trial overall ≤ 3; best capacity at most 5 % below the study without the probe (a
higher best passes). A target with nothing to judge (no losing trial) is ``n/a``.

Prints a table and writes ``benchmarks/results/capacity_cost.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _cli import run_tuner, split_overrides, wall_s  # noqa: E402

COMMAND = [
    "+workload=chat",
    "engine=sim",
    "objective=capacity",
    "tracking=none",
    "confirm.enabled=false",
]
PRESETS: dict[str, list[str]] = {
    "none": [],
    "small": [
        "workload.num_requests=100",
        "workload.arrival.concurrency=4",
        "workload.output_tokens.low=16",
        "workload.output_tokens.high=32",
        "workload.slo.tpot_ms=20",
        "workload.slo.ttft_ms=4000",
        "engine.env.TUNER_SIM_SPEEDUP=0.5",
        "objective.capacity.max_steps=6",
    ],
}
LOSING_MAX = 1.5
"""Median extra replays per losing trial, at most (with the probe)."""
OVERALL_MAX = 3.0
"""Median extra replays per trial, at most (with the probe)."""
BEST_MIN_REL = -0.05
"""The probe study's best capacity relative to the other's, at least."""


# --- arithmetic (pure; tests/unit/test_capacity_cost.py) -----------------------------------------


def median(xs: Sequence[float]) -> float | None:
    return float(statistics.median(xs)) if xs else None


def extra_replays(steps: float) -> float:
    """A trial's replays beyond the workload's own (the first step of every capacity search)."""
    return max(steps - 1.0, 0.0)


def replay_medians(trials: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Medians of ``steps`` and of their :func:`extra_replays` over the trials that have steps:
    ``all``, ``losing`` (``censored`` −1: the probe lost) and ``others``; each with ``n``."""
    with_steps = [t for t in trials if t.get("steps") is not None]
    groups = {
        "all": with_steps,
        "losing": [t for t in with_steps if (t.get("censored") or 0) < 0],
        "others": [t for t in with_steps if (t.get("censored") or 0) >= 0],
    }
    out: dict[str, dict[str, Any]] = {}
    for name, rows in groups.items():
        steps = [float(t["steps"]) for t in rows]
        out[name] = {
            "n": len(rows),
            "median_replays": median(steps),
            "median_extra_replays": median([extra_replays(s) for s in steps]),
        }
    return out


def per_trial(total: float, n: int) -> float | None:
    return total / n if n else None


def rel_diff(value: float | None, reference: float | None) -> float | None:
    """``(value − reference) / reference``; None without both or with a zero reference."""
    if value is None or not reference:
        return None
    return (value - reference) / reference


def judge(
    measured: float | None, *, at_most: float | None = None, at_least: float | None = None
) -> bool | None:
    """True when ``measured`` is within the bound, False when not, None when nothing was
    measured."""
    if measured is None:
        return None
    if at_most is not None and measured > at_most:
        return False
    return not (at_least is not None and measured < at_least)


def targets(probe: dict[str, Any], rel_best: float | None) -> list[dict[str, Any]]:
    """The three targets against the probe study's summary (:func:`summary`) and its best
    capacity relative to the study without the probe."""
    losing = probe["replays"]["losing"]["median_extra_replays"]
    overall = probe["replays"]["all"]["median_extra_replays"]
    return [
        {
            "target": "median extra replays per losing trial",
            "bound": f"<= {LOSING_MAX:g} extra",
            "measured": losing,
            "pass": judge(losing, at_most=LOSING_MAX),
        },
        {
            "target": "median extra replays per trial",
            "bound": f"<= {OVERALL_MAX:g} extra",
            "measured": overall,
            "pass": judge(overall, at_most=OVERALL_MAX),
        },
        {
            "target": "best capacity vs the study without the probe",
            "bound": f">= {100 * BEST_MIN_REL:+.0f} %",
            "measured": rel_best,
            "pass": judge(rel_best, at_least=BEST_MIN_REL),
        },
    ]


def summary(trials: Sequence[dict[str, Any]], wall_s: float, best: float | None) -> dict[str, Any]:
    counted = [t for t in trials if t["counted"]]
    server_s = sum(t["server_s"] for t in counted)
    return {
        "trials": len(trials),
        "counted": len(counted),
        "without_steps": sum(1 for t in trials if t.get("steps") is None),
        "replays": replay_medians(trials),
        "server_s": round(server_s, 1),
        "gpu_s_per_counted_trial": per_trial(server_s, len(counted)),
        "wall_s": round(wall_s, 1),
        "best_capacity_rps": best,
        "baseline_capacity_rps": [
            t["capacity_rps"]
            for t in trials
            if t["baseline"] and t["capacity_rps"] is not None and (t["censored"] or 0) >= 0
        ],
    }


# --- the studies --------------------------------------------------------------------------------


def read_study(work: Path) -> tuple[list[dict[str, Any]], float | None]:
    """Each trial of the one study in ``work``'s storage, and its best capacity."""
    import optuna

    from tuner import stored_trial
    from tuner.stored_study import incumbent_capacity

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{work / 'outputs' / 'state' / 'optuna.db'}"
    names = optuna.get_all_study_names(storage)
    if len(names) != 1:
        raise SystemExit(f"{work}: expected one study in {storage}, found {names}")
    study = optuna.load_study(study_name=names[0], storage=storage)
    rows = []
    for t in study.get_trials(deepcopy=False):
        wall = wall_s(t)
        rows.append(
            {
                "trial": t.number,
                "state": t.state.name,
                "baseline": stored_trial.is_baseline(t),
                "counted": stored_trial.counted(t),
                "failure_reason": stored_trial.failure_reason(t),
                "capacity_rps": stored_trial.metric(t, "capacity_rps"),
                "capacity_rps_high": stored_trial.metric(t, "capacity_rps_high"),
                "censored": stored_trial.metric(t, "capacity_censored"),
                "steps": stored_trial.metric(t, "capacity_steps"),
                "server_s": stored_trial.server_s(t),
                "wall_s": wall,
            }
        )
    best = incumbent_capacity(study)
    return rows, None if best is None else best.rps


def run_study(probe: bool, argv_tail: list[str], timeout_s: float) -> dict[str, Any]:
    flag = f"objective.capacity.incumbent_probe={str(probe).lower()}"
    argv = [sys.executable, "-m", "tuner", *COMMAND, flag, *argv_tail]
    print(f"probe {'on' if probe else 'off'}: {' '.join(argv[1:])}", flush=True)
    with tempfile.TemporaryDirectory(prefix="capacity-cost-") as tmp:
        work = Path(tmp)
        t0 = time.monotonic()
        p = run_tuner(argv[3:], work, timeout_s)
        wall = time.monotonic() - t0
        if p.returncode != 0:
            raise SystemExit(f"probe={probe}: the tuner exited {p.returncode}:\n{p.stderr[-3000:]}")
        trials, best = read_study(work)
    out = {"incumbent_probe": probe, "argv": ["python", *argv[1:]]}
    return out | summary(trials, wall, best) | {"trial_rows": trials}


# --- output -------------------------------------------------------------------------------------


def _num(v: float | None, fmt: str = "{:.1f}") -> str:
    return "–" if v is None else fmt.format(v)


def _caps(xs: Sequence[float]) -> str:
    return ", ".join(f"{x:.2f}" for x in xs) or "–"


def _replays(r: dict[str, Any]) -> str:
    if not r["n"]:
        return "– (n=0)"
    return f"{r['median_replays']:g} ({r['median_extra_replays']:g} extra, n={r['n']})"


def print_tables(off: dict[str, Any], on: dict[str, Any], checks: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    from tuner.capacity import shown

    console = Console(width=140)
    t = Table(title="Capacity study cost: without and with the incumbent probe")
    for col in ("", "probe off", "probe on", "target (probe on)", ""):
        t.add_column(col)
    verdict = {True: "[green]PASS[/]", False: "[red]FAIL[/]", None: "n/a"}
    by = {c["target"]: c for c in checks}
    rows: list[tuple[str, str, str, dict[str, Any] | None]] = [
        ("trials (counted)", f"{off['trials']} ({off['counted']})",
         f"{on['trials']} ({on['counted']})", None),
        ("trials without a capacity search", str(off["without_steps"]),
         str(on["without_steps"]), None),
        ("median replays per trial", _replays(off["replays"]["all"]),
         _replays(on["replays"]["all"]), by["median extra replays per trial"]),
        ("  losing trials (censored above)", _replays(off["replays"]["losing"]),
         _replays(on["replays"]["losing"]), by["median extra replays per losing trial"]),
        ("  the others", _replays(off["replays"]["others"]),
         _replays(on["replays"]["others"]), None),
        ("server (GPU) s per counted trial", _num(off["gpu_s_per_counted_trial"]),
         _num(on["gpu_s_per_counted_trial"]), None),
        ("wall s per study", _num(off["wall_s"]), _num(on["wall_s"]), None),
        ("vLLM defaults' capacity req/s", _caps(off["baseline_capacity_rps"]),
         _caps(on["baseline_capacity_rps"]), None),
        ("best capacity req/s", _num(off["best_capacity_rps"], "{:.2f}"),
         _num(on["best_capacity_rps"], "{:.2f}"), None),
        ("  on vs off", "", _num(by["best capacity vs the study without the probe"]["measured"],
                                 "{:+.1%}").replace("%", " %"),
         by["best capacity vs the study without the probe"]),
    ]  # fmt: skip
    for name, a, b, check in rows:
        if check is None:
            t.add_row(name, a, b, "", "")
        else:
            t.add_row(name, a, b, check["bound"], verdict[check["pass"]])
    console.print(t)

    per = Table(title="Trials: capacity req/s ('< X': censored above), replays, server s")
    per.add_column("trial", justify="right")
    for side in ("off", "on"):
        for col in ("capacity", "replays", "server s"):
            per.add_column(f"{col} ({side})", justify="right")
    n = max(len(off["trial_rows"]), len(on["trial_rows"]))
    for i in range(n):
        cells = [str(i)]
        for s in (off, on):
            r = s["trial_rows"][i] if i < len(s["trial_rows"]) else None
            if r is None:
                cells += ["", "", ""]
                continue
            cap = r["capacity_rps"]
            label = r["failure_reason"] or r["state"].lower()
            cap_s = shown(cap, r["censored"], r["capacity_rps_high"]) if cap is not None else label
            cells += [cap_s, _num(r["steps"], "{:g}"), _num(r["server_s"])]
        per.add_row(*cells)
    console.print(per)


def main(argv: list[str] | None = None) -> int:
    args_in, overrides = split_overrides(argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--trials", type=int, default=20, help="study.n_trials of each study")
    ap.add_argument("--seed", type=int, default=0, help="study.seed of both studies")
    small = "small: chat scaled down so that its SLOs bind at a few requests/s"
    ap.add_argument("--preset", choices=sorted(PRESETS), default="none", help=small)
    ap.add_argument("--timeout-s", type=float, default=3600.0, help="per study")
    ap.add_argument("--out", type=Path, help="default benchmarks/results/capacity_cost.json")
    args = ap.parse_args(args_in)
    tail = [f"study.n_trials={args.trials}", f"study.seed={args.seed}"]
    tail += PRESETS[args.preset] + overrides
    off = run_study(False, tail, args.timeout_s)
    on = run_study(True, tail, args.timeout_s)
    rel_best = rel_diff(on["best_capacity_rps"], off["best_capacity_rps"])
    checks = targets(on, rel_best)
    out = args.out or ROOT / "benchmarks" / "results" / "capacity_cost.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "command": ["python", "-m", "tuner", *COMMAND, "objective.capacity.incumbent_probe=X"],
        "trials": args.trials,
        "seed": args.seed,
        "preset": args.preset,
        "overrides": PRESETS[args.preset] + overrides,
        "cpus": os.cpu_count(),
        "definitions": {
            "replays": "capacity_steps: the capacity search's replays, the workload's own included",
            "extra_replays": "capacity_steps - 1: beyond the workload's own replay (the probe's "
            "is one); the targets are on these",
            "losing": "capacity_censored == -1: the probe lost, the trial ended, censored above",
            "gpu_s_per_counted_trial": "sum of server_s (seconds a server was held: start-up, "
            "replays, stop) over the counted trials / their number",
            "best_capacity_rps": "highest capacity_rps of a feasible trial not censored above",
            "best_rel_diff": "(probe on - probe off) / probe off",
        },
        "studies": {"probe_off": off, "probe_on": on},
        "best_rel_diff": rel_best,
        "targets": checks,
    }
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print_tables(off, on, checks)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
