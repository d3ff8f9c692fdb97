"""What a lever screen's servers cost with and without ``screen.predict_start`` (issue #30).

Usage::

    python benchmarks/screen_cost.py [--levers cg_piecewise,mnbt_2048,kv_fp8] [--preset small]
        [--out PATH] [--timeout-s S] [-- TUNER OVERRIDES...]

Runs the same screen twice, one after the other, each in a fresh temporary folder; only
``screen.predict_start`` differs::

    python -m tuner +workload=chat engine=sim mode=screen tracking=none screen.defaults_every=2 \\
        'screen.only=[LEVERS]' screen.predict_start=false|true [PRESET] [OVERRIDES...]

``--preset small`` is ``benchmarks/capacity_cost.py``'s (chat scaled down so that its SLOs bind
near 17 in flight, each step a cheap replay). Without it the full chat runs (about 100 s a server
on 2 cores).

Read back per server (trial) from the study's storage: its arm (``defaults`` or the lever), its
``capacity_rps``, its **replays** (``capacity_steps``: the capacity search's replays, the
workload's own included) and its ``server_s`` (seconds the server was held; on the simulator,
simulated GPU time). The first defaults' server has no prediction in either run (nothing is
measured yet), so the replays are compared over the servers after it. Each run's
``screen.json`` gives every lever's change against the defaults: the two runs' changes should
agree within the capacity search's resolution (``objective.capacity.rel_width``) and the
defaults' spread, since a prediction must not move a capacity, only its cost.

Prints a table and writes ``benchmarks/results/screen_cost.json`` (or ``--out``). No target:
the figures say how many replays (and GPU-seconds) the prediction saves a server.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _cli import run_tuner, split_overrides  # noqa: E402
from capacity_cost import PRESETS, median  # noqa: E402

COMMAND = [
    "+workload=chat",
    "engine=sim",
    "mode=screen",
    "tracking=none",
    "screen.defaults_every=2",
]


def read_screen(work: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Each server of the one study in ``work``'s storage, and the rows of its ``screen.json``."""
    import optuna

    from tuner import stored_trial

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{work / 'outputs' / 'state' / 'optuna.db'}"
    (name,) = optuna.get_all_study_names(storage)
    study = optuna.load_study(study_name=name, storage=storage)
    servers = [
        {
            "trial": t.number,
            "arm": stored_trial.screen_arm(t),
            "capacity_rps": stored_trial.metric(t, "capacity_rps"),
            "replays": stored_trial.metric(t, "capacity_steps"),
            "server_s": stored_trial.server_s(t),
        }
        for t in study.get_trials(deepcopy=False)
    ]
    (table,) = sorted((work / "outputs" / "runs").glob("*/screen.json"))
    levers = [
        {"lever": r["lever"], "capacities": r["capacities"], "change": r["change"]["value"]}
        for r in json.loads(table.read_text())["levers"]
    ]
    return servers, levers


def summary(servers: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    """Medians over the servers after the first (which no prediction can help)."""
    later = [s for s in servers[1:] if s["replays"] is not None]
    return {
        "servers": len(servers),
        "median_replays_after_first": median([float(s["replays"]) for s in later]),
        "replays_after_first": sum(float(s["replays"]) for s in later),
        "server_s_after_first": round(sum(s["server_s"] or 0.0 for s in servers[1:]), 1),
        "wall_s": round(wall, 1),
    }


def run_screen(predict: bool, tail: list[str], timeout_s: float) -> dict[str, Any]:
    flag = f"screen.predict_start={str(predict).lower()}"
    argv = [*COMMAND, flag, *tail]
    print(
        f"predict_start {'on' if predict else 'off'}: python -m tuner {' '.join(argv)}", flush=True
    )
    with tempfile.TemporaryDirectory(prefix="screen-cost-") as tmp:
        work = Path(tmp)
        t0 = time.monotonic()
        p = run_tuner(argv, work, timeout_s)
        wall = time.monotonic() - t0
        if p.returncode != 0:
            raise SystemExit(f"predict_start={predict}: exit {p.returncode}:\n{p.stderr[-3000:]}")
        servers, levers = read_screen(work)
    return (
        {"predict_start": predict, "argv": ["python", "-m", "tuner", *argv]}
        | summary(servers, wall)
        | {"server_rows": servers, "levers": levers}
    )


def print_tables(off: dict[str, Any], on: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=140)
    t = Table(title="Lever screen cost: without and with screen.predict_start")
    for col in ("", "predict off", "predict on"):
        t.add_column(col)
    for key, label in (
        ("servers", "servers"),
        ("median_replays_after_first", "median replays a server (after the first)"),
        ("replays_after_first", "replays in all (after the first)"),
        ("server_s_after_first", "server (GPU) s in all (after the first)"),
        ("wall_s", "wall s"),
    ):
        t.add_row(label, f"{off[key]:g}", f"{on[key]:g}")
    console.print(t)
    per = Table(title="Servers: arm, capacity req/s, replays")
    for col in ("trial", "arm", "off: capacity", "replays", "on: capacity", "replays"):
        per.add_column(col)
    for a, b in zip(off["server_rows"], on["server_rows"], strict=False):
        cells = [str(a["trial"]), str(a["arm"])]
        for r in (a, b):
            cap = r["capacity_rps"]
            cells += ["–" if cap is None else f"{cap:.2f}", f"{r['replays'] or 0:g}"]
        per.add_row(*cells)
    console.print(per)
    ch = Table(title="Each lever's change against the defaults (screen.json)")
    for col in ("lever", "predict off", "predict on"):
        ch.add_column(col)
    on_by = {r["lever"]: r for r in on["levers"]}
    for r in off["levers"]:
        b = on_by.get(r["lever"], {})
        cells = [r["lever"]]
        for c in (r.get("change"), b.get("change")):
            cells.append("–" if c is None else f"{100 * c:+.1f} %")
        ch.add_row(*cells)
    console.print(ch)


def main(argv: list[str] | None = None) -> int:
    args_in, overrides = split_overrides(argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--levers", default="cg_piecewise,mnbt_2048,kv_fp8", help="screen.only")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="none")
    ap.add_argument("--timeout-s", type=float, default=3600.0, help="per screen")
    ap.add_argument("--out", type=Path, help="default benchmarks/results/screen_cost.json")
    args = ap.parse_args(args_in)
    tail = [f"screen.only=[{args.levers}]", *PRESETS[args.preset], *overrides]
    off = run_screen(False, tail, args.timeout_s)
    on = run_screen(True, tail, args.timeout_s)
    out = args.out or ROOT / "benchmarks" / "results" / "screen_cost.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "command": ["python", "-m", "tuner", *COMMAND, "screen.predict_start=X", *tail],
        "preset": args.preset,
        "cpus": os.cpu_count(),
        "screens": {"predict_off": off, "predict_on": on},
    }
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print_tables(off, on)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
