"""Which rate a closed-loop capacity step should report (issue #29: one simulated confirm server
read 27 % above its repeats). Re-reads the held steps of stored runs and compares, per step:

- **little**: what the tuner stored, ``capacity_probe.step_of``'s Little's law (the slots in flight
  over the mean E2E latency of the counted requests, the loop's second round);
- **busy**: completions per second while every slot is busy after the first round has ended:
  from the last first-round request's end to the step's last send (at least 1 s, else none).
  It needs no model of the loop, but a step whose first round ends late has no such window.

Over the 23 stored runs of the quick start on this 2-core machine (2026-12-05 and -06,
``benchmarks/results/closed_loop_rate.json``), 344 held steps: where the window exists (239 steps)
the two agreed, busy/little − 1 median +0.1 %, 5-95 % −7.0 … +5.8 %; the 27 % outlier had none
(its first round ran to 12.2 s, past the step's last send).

Also, per confirm server of a config confirmed on 2 or more, its capacity against its config's
median, apart for the servers whose capacity was set by a held step right after a pruned one.
Until 2026-12-06 the simulator listened with aiohttp's backlog of 128: a first round's connections
past it reached the server a second late (`tuner/sim/server.py` ``LISTEN_BACKLOG``). Over 8 quick
starts before the fix, 80 of 123 held steps had an all-busy window, and the 20 confirm servers
after a pruned step read −4.1 … +19.4 % against their config's median (45 others −5.3 … +1.6 %);
over 4 after it, 63 of 63, and −0.5 … +0.7 % (25 others −3.3 … +1.0 %).

Usage::

    python benchmarks/closed_loop_rate.py RUN_DIR [RUN_DIR ...] [--out PATH]

Each ``RUN_DIR`` is a tuner run folder (``outputs/runs/<date>/``); every ``capacity.json`` under
it is read (the search's trials and the confirm stage's servers). A step is read from its
``capacity_K/`` folder; searches that replayed a step after a stall are left out (their folders
and steps no longer line up). The slots are the most requests in flight in the step's records.
Prints a table per run and writes ``benchmarks/results/closed_loop_rate.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _cli import missing_folders  # noqa: E402

from tuner.plots.common import read_jsonl  # noqa: E402

MIN_BUSY_S = 1.0
"""The shortest all-busy window a ``busy`` rate is read over (modelled seconds)."""


def in_flight_max(records: Sequence[dict[str, Any]]) -> int:
    """The most requests in flight at once: a closed loop's slots."""
    events = sorted(
        [(r["t_sent_s"], 1) for r in records] + [(r["t_sent_s"] + r["e2e_s"], -1) for r in records],
        key=lambda e: (e[0], e[1]),
    )
    n = top = 0
    for _, d in events:
        n += d
        top = max(top, n)
    return top


def busy_rate(records: Sequence[dict[str, Any]], slots: int) -> tuple[float | None, float]:
    """Completions per second from the end of the first round (the first ``slots`` requests by
    index) to the last send, and that window's length; None when shorter than
    :data:`MIN_BUSY_S`."""
    first = sorted(records, key=lambda r: r["index"])[:slots]
    start = max(r["t_sent_s"] + r["e2e_s"] for r in first)
    end = max(r["t_sent_s"] for r in records)
    if end - start < MIN_BUSY_S:
        return None, max(0.0, end - start)
    done = sum(1 for r in records if start < r["t_sent_s"] + r["e2e_s"] <= end)
    return done / (end - start), end - start


def steps_of(capacity_json: Path) -> list[dict[str, Any]]:
    """The held steps of one search, each with both readings (a closed loop's: an open loop's
    stored rate is its offered one, which this does not judge)."""
    doc = json.loads(capacity_json.read_text())
    if doc.get("repeated"):
        return []
    rows = []
    for k, step in enumerate(doc["steps"]):
        folder = capacity_json.parent / f"capacity_{k}"
        if (
            k == 0
            or not step["held"]
            or step.get("pruned")
            or not (folder / "requests.jsonl").is_file()
        ):
            continue
        records = [
            r
            for r in read_jsonl(folder / "requests.jsonl")
            if not r["warmup"] and r.get("e2e_s") is not None
        ]
        if len(records) < 2:
            continue
        slots = in_flight_max(records)
        busy, span = busy_rate(records, slots)
        little = float(step["rps"])
        rows.append(
            {
                "search": str(capacity_json.parent),
                "factor": step["factor"],
                "slots": slots,
                "little_rps": little,
                "busy_rps": busy,
                "busy_window_s": span,
                "busy_vs_little": None if busy is None else busy / little - 1,
            }
        )
    return rows


def _spread(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    v = sorted(values)
    return {
        "median": statistics.median(v),
        "p5": v[int(0.05 * (len(v) - 1))],
        "p95": v[int(0.95 * (len(v) - 1))],
        "min": v[0],
        "max": v[-1],
    }


def confirm_servers(run_dir: Path) -> list[dict[str, Any]]:
    """Each confirm server of a config confirmed on 2 or more: its capacity against the median
    of the config's servers, and whether the held step that set it (the highest held load) came
    right after a pruned step (a loss stopped early)."""
    rows = []
    for trial in sorted((run_dir / "confirm").glob("trial_*")):
        servers = []
        for rnd in sorted(trial.glob("round_*")):
            cj = rnd / "capacity.json"
            if not cj.is_file():
                continue
            doc = json.loads(cj.read_text())
            cap = (doc.get("capacity") or {}).get("capacity_rps")
            held = [(k, st) for k, st in enumerate(doc["steps"]) if st["held"]]
            if cap is None or not held:
                continue
            k, _ = max(held, key=lambda ks: ks[1]["factor"])
            after = k > 0 and doc["steps"][k - 1].get("pruned") is not None
            servers.append(
                {"server": f"{trial.name}/{rnd.name}", "rps": cap, "after_pruned": after}
            )
        if len(servers) >= 2:
            mid = statistics.median(x["rps"] for x in servers)
            rows += [{**x, "vs_median": x["rps"] / mid - 1} for x in servers]
    return rows


def _against_median(runs: list[dict[str, Any]], after_pruned: bool) -> dict[str, float]:
    """The spread of the confirm servers' capacities against their config's median, over those
    set (or not) right after a pruned step, with how many."""
    v = [
        x["vs_median"]
        for run in runs
        for x in run["confirm_servers"]
        if x["after_pruned"] is after_pruned
    ]
    return _spread(v) | {"servers": len(v)}


def analyse(run_dir: Path) -> dict[str, Any]:
    rows = [row for cj in sorted(run_dir.rglob("capacity.json")) for row in steps_of(cj)]
    busy = [r["busy_vs_little"] for r in rows if r["busy_vs_little"] is not None]
    none = [r for r in rows if r["busy_rps"] is None]
    return {
        "run": str(run_dir),
        "steps": len(rows),
        "with_busy_window": len(busy),
        "busy_vs_little": _spread(busy),
        "no_busy_window": len(none),
        "rows": rows,
        "confirm_servers": confirm_servers(run_dir),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="tuner run folders (outputs/runs/<date>/)")
    ap.add_argument("--out", type=Path, help="default benchmarks/results/closed_loop_rate.json")
    args = ap.parse_args(argv)
    if missing_folders(args.runs):
        return 2
    runs = [analyse(p) for p in args.runs]
    every = [
        r["busy_vs_little"] for run in runs for r in run["rows"] if r["busy_vs_little"] is not None
    ]
    doc = {
        "command": "python benchmarks/closed_loop_rate.py " + " ".join(map(str, args.runs)),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "runs": runs,
        "busy_vs_little": _spread(every),
        "steps": sum(run["steps"] for run in runs),
        "with_busy_window": sum(run["with_busy_window"] for run in runs),
        "confirm_vs_median": {
            key: _against_median(runs, after)
            for key, after in (("after_pruned", True), ("otherwise", False))
        },
    }
    out = args.out or ROOT / "benchmarks" / "results" / "closed_loop_rate.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print_table(doc)
    print(f"wrote {out}")
    return 0


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def print_table(doc: dict[str, Any]) -> None:
    print(f"{'run':<40} {'steps':>5} {'busy':>5} {'busy/little-1 median':>21} {'p5':>7} {'p95':>7}")
    for run in doc["runs"]:
        s = run["busy_vs_little"] or {}
        print(
            f"{run['run'][-40:]:<40} {run['steps']:>5} {run['with_busy_window']:>5} "
            f"{_pct(s.get('median')):>21} {_pct(s.get('p5')):>7} {_pct(s.get('p95')):>7}"
        )
    s = doc["busy_vs_little"] or {}
    print(
        f"all: {doc['steps']} held steps, {doc['with_busy_window']} with an all-busy window; "
        f"busy/little − 1: median {_pct(s.get('median'))}, "
        f"5-95 % {_pct(s.get('p5'))} … {_pct(s.get('p95'))}"
    )
    for key, v in doc["confirm_vs_median"].items():
        print(
            f"confirm servers, {key.replace('_', ' ')}: {v['servers']}, against their config's "
            f"median {_pct(v.get('min'))} … {_pct(v.get('max'))} (median {_pct(v.get('median'))})"
        )


if __name__ == "__main__":
    raise SystemExit(main())
