"""How much parallel trials bias each other, and what CPU pinning takes back.

The same config (vLLM's defaults: ``space=none``) is measured in three groups, each a tuner study
of its own: **alone** (``study.n_workers=1`` on one GPU), **parallel** (two at once,
``study.n_workers=2`` on two GPUs) and **parallel+pinned** (the same with
``engine.cpu_pinning=true``: each server on its own CPU cores, the tuner on
``engine.cpu_reserve`` more). Parallel trials count
only if another trial was replaying beside them (metric ``co_running_gpus`` = 1). Prints mean
output tok/s and TTFT p50 per group and the ratio to alone; writes
``benchmarks/results/interference.json``.

    python benchmarks/interference.py [--trials N] [--out PATH] [-- TUNER OVERRIDES...]

On the 2-GPU H200 machine: ``python benchmarks/interference.py --trials 4 -- engine=vllm
+workload=chat workload.num_requests=300``. Without overrides it runs on the simulator (the
numbers then measure this machine's CPU contention, not a GPU's).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import optuna

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "interference.json"
GROUPS = {
    "alone": ["study.n_workers=1", "engine.gpus=[0]"],
    "parallel": ["study.n_workers=2", "engine.gpus=[0,1]"],
    "parallel+pinned": ["study.n_workers=2", "engine.gpus=[0,1]", "engine.cpu_pinning=true"],
}


def run_group(name: str, extra: list[str], trials: int, overrides: list[str], tmp: Path) -> dict:
    cwd = tmp / name.replace("+", "_")
    cwd.mkdir()
    argv = [
        sys.executable,
        "-m",
        "tuner",
        *(["+workload=chat"] if not any("workload=" in o for o in overrides) else []),
        "space=none",
        f"study.n_trials={trials}",
        f"study.name=interference-{name}",
        "study.baseline_first=false",
        "confirm.enabled=false",
        "tracking=none",
        *extra,
        *overrides,
    ]
    t0 = time.perf_counter()
    p = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    if p.returncode != 0:
        raise SystemExit(f"{name}: the tuner failed ({p.returncode}):\n{p.stderr[-3000:]}")
    storage = f"sqlite:///{cwd / 'outputs' / 'state' / 'optuna.db'}"
    study = optuna.load_study(study_name=f"interference-{name}", storage=storage)
    rows = []
    for t in study.trials:
        m = t.user_attrs.get("metrics") or {}
        if t.user_attrs.get("failure_reason") or "output_throughput" not in m:
            continue
        co = m.get("co_running_gpus", 0.0)
        if name != "alone" and co < 1:
            continue  # ran without a neighbour: not a parallel measurement
        rows.append(
            {
                "trial": t.number,
                "gpus": t.user_attrs.get("gpus"),
                "output_throughput": m["output_throughput"],
                "ttft_p50_ms": m.get("ttft_p50_ms"),
                "co_running_gpus": co,
                "cpus_pinned": m.get("cpus_pinned"),
            }
        )
    tok = [r["output_throughput"] for r in rows]
    ttft = [r["ttft_p50_ms"] for r in rows if r["ttft_p50_ms"] is not None]
    return {
        "group": name,
        "trials_run": len(study.trials),
        "trials_counted": len(rows),
        "output_throughput_mean": statistics.fmean(tok) if tok else None,
        "ttft_p50_ms_mean": statistics.fmean(ttft) if ttft else None,
        "wall_s": round(time.perf_counter() - t0, 1),
        "trials": rows,
    }


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    overrides: list[str] = []
    if "--" in args_in:
        i = args_in.index("--")
        args_in, overrides = args_in[:i], args_in[i + 1 :]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--trials", type=int, default=4, help="trials per group (default 4)")
    ap.add_argument(
        "--groups", default=",".join(GROUPS), help="comma-separated, of: " + ", ".join(GROUPS)
    )
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(args_in)
    if not overrides:  # the simulator, small and quick
        overrides = ["workload.num_requests=60", "workload.arrival.concurrency=16"]
        overrides.append("engine.cpu_reserve=0")  # a small CI-sized machine: every core to servers
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="interference-") as tmp:
        for name in [g.strip() for g in args.groups.split(",") if g.strip()]:
            results.append(run_group(name, GROUPS[name], args.trials, overrides, Path(tmp)))
    alone = next((r for r in results if r["group"] == "alone"), None)
    base = alone["output_throughput_mean"] if alone else None
    print(f"{'group':<16} {'counted':>7} {'out tok/s':>11} {'TTFT p50 ms':>12} {'vs alone':>9}")
    nan = float("nan")
    for r in results:
        tok = r["output_throughput_mean"]
        ratio = tok / base if tok and base else None
        r["ratio_to_alone"] = ratio
        ttft = r["ttft_p50_ms_mean"]
        print(
            f"{r['group']:<16} {r['trials_counted']:>3}/{r['trials_run']:<3} "
            f"{tok if tok is not None else nan:>11,.1f} "
            f"{ttft if ttft is not None else nan:>12,.0f} "
            f"{ratio if ratio is not None else nan:>9.3f}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {"benchmark": "interference", "overrides": overrides, "groups": results}, indent=2
        )
        + "\n"
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
