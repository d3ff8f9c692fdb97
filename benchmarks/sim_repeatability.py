"""How well SLO capacity repeats on the simulator, idle and with a busy core (issue #34).

Usage::

    python benchmarks/sim_repeatability.py [--modes idle,busy] [--trials 3] [--out PATH]
        [--timeout-s S] [-- TUNER OVERRIDES...]

For each mode it runs, in a fresh temporary folder, the command::

    python -m tuner +workload=chat engine=sim objective=capacity space=none \\
        study.n_trials=3 confirm.enabled=false tracking=none [OVERRIDES...]

i.e. vLLM's defaults on three fresh simulated servers, each trial an SLO capacity search
(``conf/objective/capacity.yaml``). ``busy``: a CPU-bound Python process (a spin loop, its own
process group) occupies one core for the whole run; it is started before the tuner and stopped
after it (and stops by itself after ``--timeout-s``). ``idle``: nothing else is started (other
programs on the machine are not stopped: ``uptime``'s load before and after is recorded).

Per mode: each trial's capacity (req/s), its replays (``capacity_steps``), its wall time (Optuna's
start to complete: launch, replays, stop), the client's p99 lag, and the simulator's own lag
warnings (``Simulator behind its model`` lines in each trial's ``server.log``: how many, and the
largest p99 they report); the spread (max − min) / mean of the capacities. Prints a table and
writes ``benchmarks/results/sim_repeatability.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _cli import listed, run_tuner, split_overrides, wall_s

ROOT = Path(__file__).resolve().parents[1]

COMMAND = [
    "+workload=chat",
    "engine=sim",
    "objective=capacity",
    "space=none",
    "confirm.enabled=false",
    "tracking=none",
]
BUSY = "import time\nend = time.monotonic() + {t}\nwhile time.monotonic() < end:\n    pass\n"
LAG_LINE = re.compile(r"Simulator behind its model: stream chunks left ([\d.]+) ms late at p99")


def load() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def spin(seconds: float) -> subprocess.Popen[bytes]:
    """A CPU-bound process on one core, in its own process group, that ends after ``seconds``."""
    return subprocess.Popen(
        [sys.executable, "-c", BUSY.format(t=seconds)],
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=10)


def trial_rows(work: Path, study: str) -> list[dict[str, Any]]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{work / 'outputs' / 'state' / 'optuna.db'}"
    rows: list[dict[str, Any]] = []
    names = optuna.get_all_study_names(storage)
    if study not in names and len(names) == 1:  # the default name carries the objective
        study = names[0]
    for t in optuna.load_study(study_name=study, storage=storage).trials:
        m = t.user_attrs.get("metrics", {})
        lags: list[float] = []
        tdir = Path(t.user_attrs.get("trial_dir", ""))
        log = tdir / "server.log"
        if log.is_file():
            lags = [float(x) for x in LAG_LINE.findall(log.read_text(errors="replace"))]
        wall = wall_s(t)
        rows.append(
            {
                "trial": t.number,
                "state": t.state.name,
                "capacity_rps": m.get("capacity_rps"),
                "capacity_rps_low": m.get("capacity_rps_low"),
                "capacity_rps_high": m.get("capacity_rps_high"),
                "replays": m.get("capacity_steps"),
                "wall_s": wall,
                "client_lag_p99_ms": m.get("client_lag_p99_ms"),
                "sim_lag_warnings": len(lags),
                "sim_lag_p99_ms_max": max(lags, default=0.0),
            }
        )
    return rows


def run_mode(mode: str, trials: int, overrides: list[str], timeout_s: float) -> dict[str, Any]:
    before = load()
    busy = spin(timeout_s) if mode == "busy" else None
    t0 = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="sim-repeat-") as tmp:
            work = Path(tmp)
            argv = [*COMMAND, f"study.n_trials={trials}", *overrides]
            p = run_tuner(argv, work, timeout_s)
            wall = time.monotonic() - t0
            if p.returncode != 0:
                raise SystemExit(f"{mode}: the tuner exited {p.returncode}:\n{p.stderr[-3000:]}")
            rows = trial_rows(work, "chat-qwen3-8b-sim")
    finally:
        if busy is not None:
            stop(busy)
    caps = [r["capacity_rps"] for r in rows if r["capacity_rps"] is not None]
    walls = [r["wall_s"] for r in rows if r["wall_s"] is not None]
    steps = [r["replays"] for r in rows if r["replays"] is not None]
    return {
        "mode": mode,
        "uptime_before": before,
        "uptime_after": load(),
        "trials": rows,
        "capacities_rps": caps,
        "spread": (max(caps) - min(caps)) / statistics.fmean(caps) if caps else None,
        "mean_trial_wall_s": statistics.fmean(walls) if walls else None,
        "max_trial_wall_s": max(walls, default=None),
        "mean_replays": statistics.fmean(steps) if steps else None,
        "run_wall_s": round(wall, 1),
    }


def main(argv: list[str] | None = None) -> int:
    args_in, overrides = split_overrides(argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--modes", default="idle,busy", help="idle, busy or both, in that order")
    ap.add_argument("--trials", type=int, default=3, help="fresh servers (trials) per mode")
    ap.add_argument("--timeout-s", type=float, default=900.0, help="per mode")
    ap.add_argument("--out", type=Path, help="default benchmarks/results/sim_repeatability.json")
    args = ap.parse_args(args_in)
    modes = listed(ap, args.modes, ("idle", "busy"), "mode")
    results = [run_mode(m, args.trials, overrides, args.timeout_s) for m in modes]
    out = args.out or ROOT / "benchmarks" / "results" / "sim_repeatability.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"command": ["python", "-m", "tuner", *COMMAND, f"study.n_trials={args.trials}"]}
    doc |= {"overrides": overrides, "cpus": os.cpu_count(), "modes": results}
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{'mode':<5} {'capacities req/s':<28} {'spread':>7} {'wall s/trial':>13} "
          f"{'replays':>8} {'sim lag warnings':>17}  load before -> after")  # fmt: skip
    for r in results:
        caps = ", ".join(f"{c:.1f}" for c in r["capacities_rps"])
        walls = "/".join(f"{t['wall_s']:.0f}" for t in r["trials"] if t["wall_s"] is not None)
        warn = sum(t["sim_lag_warnings"] for t in r["trials"])
        worst = max((t["sim_lag_p99_ms_max"] for t in r["trials"]), default=0.0)
        la = [
            s.split("load average: ")[-1].split(",")[0]
            for s in (r["uptime_before"], r["uptime_after"])
        ]
        spread = f"{100 * r['spread']:.1f} %" if r["spread"] is not None else "-"
        print(
            f"{r['mode']:<5} {caps:<28} {spread:>7} {walls:>13} {r['mean_replays'] or 0:>8.1f} "
            f"{warn:>5} (p99 <= {worst:.0f} ms)  {la[0]} -> {la[1]}"
        )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
