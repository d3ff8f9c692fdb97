"""What the simulator predicts for a grid of engine flags on a workload, per request stream.

Evaluates every combination of the ``--grid`` values on :func:`tuner.sim.landscape.evaluate` (the
calibrated simulated engine, in virtual time, in process) with the workload the Hydra overrides
compose, once per ``--seeds`` value (``workload.seed``), plus vLLM's defaults; prints one row per
config and stream and writes the rows as JSON with ``--out``. Closed loop only
(``workload.arrival.kind=concurrency``). Params use the tuner's names (``conf/space``); values are
parsed as YAML scalars (``16``, ``0.35``, ``fp8``, ``true``).

    python scripts/sim_sweep.py --grid kv_cache_dtype=fp8 --grid max_num_seqs=20,24,28 \\
        --grid max_num_batched_tokens=2048,4096 --seeds 0 1 -- \\
        +workload=long_docs model=qwen3-8b workload.arrival.concurrency=32 workload.num_requests=96
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tuner.checks import load_config  # noqa: E402
from tuner.errors import ConfigError  # noqa: E402
from tuner.memory import GPU_PROFILES, ModelShape  # noqa: E402
from tuner.sim.landscape import evaluate, prepare_stream  # noqa: E402
from tuner.workload import build_requests  # noqa: E402


def parse_grid(items: list[str]) -> dict[str, list[Any]]:
    grid: dict[str, list[Any]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        if not sep or not key or not values:
            raise SystemExit(f"error: --grid {item!r}; expected NAME=V1,V2,...")
        grid[key] = [yaml.safe_load(v) for v in values.split(",")]
    return grid


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grid", action="append", default=[], help="NAME=V1,V2,... (repeatable)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. +workload=long_docs")
    args = ap.parse_args()
    grid = parse_grid(args.grid)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            base = [f"paths.output_dir={tmp}", f"paths.state_dir={tmp}"]
            cfg = load_config([*base, *args.overrides])
        except ConfigError as exc:
            raise SystemExit(f"error: {exc}") from None
    w = cfg.workload
    if w.arrival.kind != "concurrency":
        kind = w.arrival.kind
        raise SystemExit(f"error: workload.arrival.kind is {kind!r}; allowed: concurrency")
    unknown = sorted(set(grid) - set(cfg.space.params))
    if unknown:
        raise SystemExit(f"error: --grid names {unknown}; allowed: {sorted(cfg.space.params)}")
    shape = ModelShape.from_dir(cfg.model.path)
    gpu = GPU_PROFILES[cfg.engine.gpu]
    streams = {
        s: prepare_stream(
            build_requests(replace(w, seed=s), cfg.model.files), w.system_prompt_tokens
        )
        for s in args.seeds
    }
    configs: list[dict[str, Any]] = [{}]
    configs += [dict(zip(grid, combo, strict=True)) for combo in itertools.product(*grid.values())]
    rows = []
    print(
        f"{'config':<60} {'seed':>4} {'goodput':>8} {'tok/s':>7} {'TTFT p50':>9} "
        f"{'TPOT p50':>9} {'preempt':>7} {'KV tokens':>10}"
    )
    for params in configs:
        name = " ".join(f"{k}={v}" for k, v in params.items()) or "vLLM defaults"
        for s, stream in streams.items():
            r = evaluate(shape, gpu, params, stream, concurrency=w.arrival.concurrency, slo=w.slo)
            rows.append({"params": params, "seed": s, **r.__dict__})
            if not r.feasible:
                print(f"{name:<60} {s:>4} does not start: {r.failure}")
                continue
            print(
                f"{name:<60} {s:>4} {r.goodput:>8.3f} {r.output_throughput:>7.0f} "
                f"{r.ttft_p50_ms:>9.0f} {r.tpot_p50_ms:>9.1f} {r.preemptions:>7} "
                f"{r.kv_tokens:>10,}"
            )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps({"overrides": args.overrides, "grid": grid, "rows": rows}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
