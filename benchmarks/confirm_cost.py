"""Where a confirm server's capacity search starts, and what it costs (issue #29).

Usage::

    python benchmarks/confirm_cost.py [--seeds 0,1,2] [--trials 12] [--rounds 3] [--out PATH]
        [--timeout-s S] [-- TUNER OVERRIDES...]

Per seed, one search and then its confirm stage twice, each on its own copy of the stored search
(``study.n_trials=0`` runs only the confirm stage of a stored study)::

    python -m tuner +workload=chat engine=sim tracking=none study.seed=S study.n_trials=N \\
        confirm.enabled=false [OVERRIDES...]                     # the search, once
    python -m tuner ... study.n_trials=0 confirm.rounds=R        # its confirm stage, two ways

The two confirm stages differ only in where a pick's servers after its first start their
capacity search (:func:`tuner.confirm.capacity_start`):

- **search**: every server at the pick's search capacity (a censored pick's: between its estimate
  and the load where it lost), as before 2026-12-05. The benchmark reproduces it by calling
  ``capacity_start`` without the earlier servers (``python -c``, a patch of this process only).
- **earlier** (as shipped): once a server of the pick bracketed its capacity, the next start at
  the earlier servers' median crossing, on the same stressed stream.

A pick's first server starts at the search's capacity either way, so round 1 is the same
procedure in both; the rounds after it are what differs. Read from each run's folder
(``confirm/trial_NNNN/round_R/capacity.json``: the steps and the capacity; ``confirm.json``: the
picks, whether a pick's search capacity was censored, the verdict):

- **replays** per server after round 1, mean and total, and the confirm stage's wall time;
- per pick, its capacities per round in both modes: the difference of the means against the
  rounds' spread (max − min over both modes' servers): where a server starts must not move what
  it measures by more than that;
- both verdicts.

Targets: fewer replays per server after round 1 with ``earlier``; every pick's mean capacity
within its servers' spread of the other mode's. Prints a table and writes
``benchmarks/results/confirm_cost.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _cli import run_tuner, split_overrides  # noqa: E402

COMMAND = ["+workload=chat", "engine=sim", "objective=capacity", "tracking=none"]
MODES = ("search", "earlier")

_SEARCH_START = """
import runpy, sys
import tuner.confirm, tuner.confirm_stage as stage
_start = tuner.confirm.capacity_start
assert stage.capacity_start is _start, "confirm_stage no longer calls confirm.capacity_start"
stage.capacity_start = lambda c, cfg, earlier=(): _start(c, cfg)  # the search's, always
sys.argv = ["tuner", *sys.argv[1:]]
runpy.run_module("tuner", run_name="__main__", alter_sys=True)
"""
"""``python -m tuner`` with every confirm server started at its pick's search capacity."""


def run_confirm(mode: str, argv: list[str], cwd: Path, timeout_s: float) -> float:
    """The confirm stage of the study stored in ``cwd``; its wall seconds."""
    t0 = time.perf_counter()
    p = run_tuner(argv, cwd, timeout_s, code=None if mode == "earlier" else _SEARCH_START)
    if p.returncode != 0:
        raise SystemExit(f"confirm ({mode}) failed in {cwd}:\n{p.stderr[-3000:]}")
    return time.perf_counter() - t0


def read_confirm(work: Path) -> dict[str, Any]:
    """Each confirm server's replays and capacity, per pick, and the verdict, from the run dir."""
    (run,) = [d for d in (work / "outputs" / "runs").iterdir() if (d / "confirm.json").is_file()]
    doc = json.loads((run / "confirm.json").read_text())
    picks = []
    for c in doc["candidates"]:
        servers = []
        for f in sorted(
            (run / "confirm" / f"trial_{c['trial']:04d}").glob("round_*/capacity.json")
        ):
            cap = json.loads(f.read_text())
            servers.append({
                "round": int(f.parent.name.split("_")[1]),
                "replays": len(cap["steps"]),
                "start": cap["steps"][1]["factor"] if len(cap["steps"]) > 1 else None,
                "capacity_rps": cap["capacity"]["capacity_rps"],
                "censored": cap["capacity"]["capacity_censored"],
            })  # fmt: skip
        servers.sort(key=lambda s: s["round"])
        picks.append({
            "trial": c["trial"],
            "picks": c["picks"],
            "search_censored": c["search_metrics"].get("capacity_censored", 0.0) < 0,
            "servers": servers,
        })  # fmt: skip
    v = doc.get("verdict") or {}
    return {"picks": picks, "verdict": {k: v.get(k) for k in ("kind", "recommended", "gains")}}


def later_replays(picks: list[dict[str, Any]]) -> list[int]:
    """Replays of every server after its pick's first."""
    return [s["replays"] for p in picks for s in p["servers"] if s["round"] > 1]


def compare(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """Per pick (the same trials in both, as both confirm the same stored search): the two
    modes' mean capacities, their difference, and the spread of all its servers."""
    rows = []
    for pa, pb in zip(a["picks"], b["picks"], strict=True):
        assert pa["trial"] == pb["trial"]
        ca = [s["capacity_rps"] for s in pa["servers"]]
        cb = [s["capacity_rps"] for s in pb["servers"]]
        both = ca + cb
        ma, mb = statistics.fmean(ca), statistics.fmean(cb)
        spread = (max(both) - min(both)) / statistics.fmean(both)
        rows.append({
            "trial": pa["trial"], "picks": pa["picks"], "search_censored": pa["search_censored"],
            "search_rps": ca, "earlier_rps": cb, "diff": (mb - ma) / ma, "spread": spread,
            "within": abs(mb - ma) / ma <= spread,
            "search_replays": [s["replays"] for s in pa["servers"]],
            "earlier_replays": [s["replays"] for s in pb["servers"]],
        })  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    own, overrides = split_overrides(argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--trials", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timeout-s", type=float, default=1800.0)
    ap.add_argument("--out", type=Path, help="default benchmarks/results/confirm_cost.json")
    args = ap.parse_args(own)
    seeds = [int(s) for s in args.seeds.split(",")]
    out = args.out or ROOT / "benchmarks" / "results" / "confirm_cost.json"
    studies = []
    with tempfile.TemporaryDirectory(prefix="confirm_cost-") as tmp:
        for seed in seeds:
            base = [*COMMAND, f"study.seed={seed}", *overrides]
            search = Path(tmp) / f"seed_{seed}" / "study"
            search.mkdir(parents=True)
            print(f"seed {seed}: the search ({args.trials} trials)", flush=True)
            p = run_tuner([*base, f"study.n_trials={args.trials}", "confirm.enabled=false"],
                          search, args.timeout_s)  # fmt: skip
            if p.returncode != 0:
                raise SystemExit(f"the search failed:\n{p.stderr[-3000:]}")
            got: dict[str, Any] = {"seed": seed}
            for mode in MODES:
                work = search.parent / mode
                shutil.copytree(search / "outputs" / "state", work / "outputs" / "state")
                print(f"seed {seed}: its confirm stage, later servers from the {mode}'s capacity",
                      flush=True)  # fmt: skip
                again = [*base, "study.n_trials=0", f"confirm.rounds={args.rounds}"]
                wall = run_confirm(mode, again, work, args.timeout_s)
                got[mode] = {**read_confirm(work), "wall_s": wall}
            got["picks"] = compare(got["search"], got["earlier"])
            studies.append(got)
    summary = {}
    for mode in MODES:
        later = [r for s in studies for r in later_replays(s[mode]["picks"])]
        summary[mode] = {
            "servers_after_the_first": len(later),
            "replays_after_the_first": sum(later),
            "replays_per_server_after_the_first": statistics.fmean(later) if later else None,
            "confirm_wall_s": [round(s[mode]["wall_s"], 1) for s in studies],
        }
    picks = [p for s in studies for p in s["picks"]]
    checks = {
        "fewer_replays": (summary["earlier"]["replays_after_the_first"]
                          < summary["search"]["replays_after_the_first"]),
        "capacities_within_spread": all(p["within"] for p in picks),
    }  # fmt: skip
    doc = {
        "command": " ".join(["python benchmarks/confirm_cost.py", *own, "--", *overrides]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpus": os.cpu_count(),
        "trials": args.trials,
        "rounds": args.rounds,
        "summary": summary,
        "checks": checks,
        "studies": studies,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print_table(studies, summary, checks)
    print(f"wrote {out}")
    return 0 if all(checks.values()) else 1


def print_table(
    studies: list[dict[str, Any]], summary: dict[str, Any], checks: dict[str, bool]
) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="Confirm servers: replays each (round 1, 2, ...) and capacity req/s per round")
    for col in ("seed", "trial (picks)", "search start", "earlier start", "diff", "spread"):
        t.add_column(col)
    for s in studies:
        for p in s["picks"]:
            censored = "; censored" if p["search_censored"] else ""
            name = f"{p['trial']} ({', '.join(p['picks'])}{censored})"
            row = [str(s["seed"]), name]
            for mode in MODES:
                reps = "/".join(str(r) for r in p[f"{mode}_replays"])
                caps = " / ".join(f"{c:.1f}" for c in p[f"{mode}_rps"])
                row.append(f"{reps} replays: {caps}")
            row += [f"{p['diff']:+.1%}", f"{p['spread']:.1%}"]
            t.add_row(*row)
    console = Console(width=160)
    console.print(t)
    for mode in MODES:
        m = summary[mode]
        each = m["replays_per_server_after_the_first"]
        console.print(
            f"{mode}: {m['replays_after_the_first']} replays on the "
            f"{m['servers_after_the_first']} servers after each pick's first "
            f"({'-' if each is None else f'{each:.2f}'} each); "
            f"confirm stage {m['confirm_wall_s']} s"
        )
    console.print(f"checks: {checks}")


if __name__ == "__main__":
    raise SystemExit(main())
