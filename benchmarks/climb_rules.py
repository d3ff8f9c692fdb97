"""How a closed loop that holds at the incumbent's load climbs: by narrow steps always (the rule
before 2026-12-06), or by its margin when it served clearly more than the incumbent there
(``tuner.capacity._clear_winner``: more than ``rel_width`` above the incumbent's capacity; issue
#29). Re-runs :func:`tuner.capacity.search` on stored searches, each trial's own steps as its
landscape: a step's margin and served rate at any load are read off the straight lines through
the stored steps (held steps' rates; past the last one, its rate), and a step that fails is taken
as pruned (as near the SLOs' edge most were). Under the narrow rule this model replays the stored
searches' own step counts (the check of the model).

Usage::

    python benchmarks/climb_rules.py RUN_DIR [RUN_DIR ...] [--out PATH]

Each ``RUN_DIR`` is a search's run folder (``outputs/runs/<date>/``, the quick start's first). A
trial counts when its search held at the incumbent's load: the step after the workload's own
held, at the load of the best capacity measured (not capped) by an earlier trial of the folder.
Prints a table and writes ``benchmarks/results/climb_rules.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _cli import missing_folders  # noqa: E402

from tuner import capacity  # noqa: E402
from tuner.capacity import Start, Step, search  # noqa: E402
from tuner.config import CapacityConfig  # noqa: E402

SETTINGS = CapacityConfig(rel_width=0.05, max_steps=8)


def line_at(points: Sequence[tuple[float, float]], x: float) -> float:
    """The value at ``x`` on the straight lines through ``points`` (extended at both ends).

    >>> line_at([(1.0, 0.5), (2.0, 0.0)], 3.0)
    -0.5
    """
    pts = sorted(points)
    if len(pts) == 1:
        return pts[0][1]
    i = next((k for k in range(1, len(pts) - 1) if x <= pts[k][0]), len(pts) - 1)
    (a, ya), (b, yb) = pts[i - 1], pts[i]
    return ya if b == a else ya + (yb - ya) * (x - a) / (b - a)


def landscape(steps: Sequence[dict[str, Any]]) -> Callable[[float], Awaitable[Step]]:
    """A probe that answers from the stored ``steps`` (module docstring)."""
    margins = [(float(s["factor"]), float(s["margin"])) for s in steps]
    held = [(float(s["factor"]), float(s["rps"])) for s in steps if s["held"]]
    top = max(held)

    async def probe(f: float) -> Step:
        m = line_at(margins, f)
        rps = line_at(held, f) if f <= top[0] else top[1]
        return Step(f, rps, m, m >= 0, {}, None if m >= 0 else "failed")

    return probe


def whole(slots: int) -> Callable[[float], float]:
    """A closed loop's load factor as run: a whole number of the workload's ``slots``."""
    return lambda f: math.ceil(round(f * slots, 6)) / slots


async def replay(steps: Sequence[dict[str, Any]], start: Start, slots: int, narrow: bool) -> Any:
    probe = landscape(steps)
    counted = 0

    async def counting(f: float) -> Step:
        nonlocal counted
        counted += 1
        return await probe(f)

    keep = capacity._clear_winner
    if narrow:  # the rule before: every hold at the incumbent's load walks by narrow steps
        capacity._clear_winner = lambda *_: False  # type: ignore[assignment]
    try:
        s0 = steps[0]
        first = Step(1.0, float(s0["rps"]), float(s0["margin"]), bool(s0["held"]))
        cap = await search(
            counting, SETTINGS, first, whole(slots), start=start, stop_on_loss=True, closed=True
        )
    finally:
        capacity._clear_winner = keep
    return {"replays": len(cap.steps), "capacity": cap.rps, "capped": cap.capped}


def climbs(run: Path, slots: int) -> list[dict[str, Any]]:
    """Each trial of ``run`` whose search held at the incumbent's load, both rules replayed."""
    rows: list[dict[str, Any]] = []
    best: float | None = None
    best_factor = 0.0
    for path in sorted(run.glob("trial_*/capacity.json")):
        doc = json.loads(path.read_text())
        steps, cap = doc["steps"], doc["capacity"]
        at_incumbent = (
            best is not None
            and len(steps) > 1
            and steps[0]["held"]
            and steps[1]["held"]
            and abs(float(steps[1]["factor"]) - best_factor) < 0.02 * best_factor
        )
        if at_incumbent:
            assert best is not None
            start = Start(best_factor, best)
            old = asyncio.run(replay(steps, start, slots, narrow=True))
            new = asyncio.run(replay(steps, start, slots, narrow=False))
            rows.append(
                {
                    "trial": path.parent.name,
                    "stored_replays": len(steps),
                    "stored_capacity": cap["capacity_rps"],
                    "incumbent": best,
                    "served_at_incumbent": steps[1]["rps"],
                    "narrow": old,
                    "by_margin_when_clear": new,
                }
            )
        if cap.get("capacity_censored", 0.0) == 0.0 and (
            best is None or cap["capacity_rps"] > best
        ):
            best, best_factor = float(cap["capacity_rps"]), float(cap["capacity_factor"])
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="search run folders (outputs/runs/<date>/)")
    ap.add_argument("--slots", type=int, default=64, help="the workload's requests in flight")
    ap.add_argument("--out", type=Path, help="default benchmarks/results/climb_rules.json")
    args = ap.parse_args(argv)
    if missing_folders(args.runs):
        return 2
    runs = [{"run": str(p), "climbs": climbs(p, args.slots)} for p in args.runs]
    rows = [r for run in runs for r in run["climbs"]]
    doc = {
        "command": "python benchmarks/climb_rules.py " + " ".join(map(str, args.runs)),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "runs": runs,
        "replays": {
            "stored": sum(r["stored_replays"] for r in rows),
            "narrow": sum(r["narrow"]["replays"] for r in rows),
            "by_margin_when_clear": sum(r["by_margin_when_clear"]["replays"] for r in rows),
        },
    }
    out = args.out or ROOT / "benchmarks" / "results" / "climb_rules.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print_table(doc)
    print(f"wrote {out}")
    return 0


def print_table(doc: dict[str, Any]) -> None:
    print(
        f"{'run / trial':<42} {'served vs incumbent':>19} {'stored':>12} {'narrow':>12} "
        f"{'by margin':>12}"
    )
    for run in doc["runs"]:
        for r in run["climbs"]:
            n, m = r["narrow"], r["by_margin_when_clear"]
            print(
                f"{(run['run'][-28:] + ' ' + r['trial']):<42} "
                f"{r['served_at_incumbent'] / r['incumbent'] - 1:>+19.1%} "
                f"{r['stored_replays']:>3} {r['stored_capacity']:>7.1f}  "
                f"{n['replays']:>3} {n['capacity']:>7.1f}  {m['replays']:>3} {m['capacity']:>7.1f}"
            )
    t = doc["replays"]
    print(
        f"replays in all: stored {t['stored']}, narrow {t['narrow']}, "
        f"by margin when clear {t['by_margin_when_clear']}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
