"""The simulator's speed with online fp8 weights against the H200's; the fit of its one constant.

The real runs: the 3 + 3 fresh servers of docs/gpu-runs/2026-12-02-screen-fp8-3x3/ (vLLM 0.24.0,
the Qwen3-8B shape with dummy weights, one H200; chat at 256 in flight, 800 requests, TPOT p95 <=
50 ms): vLLM's defaults (``trial0``) and ``--quantization fp8`` (``trial1``), each server's
capacity steps in ``capacity-*-trial*.json``. At each load where both arms have held steps (1x
and 1.5x the workload's 256 in flight), the real fp8/defaults ratios of TPOT p50 and output tok/s
(each arm's mean over its servers that held there) are compared with the simulator's, which
evaluates the same step's requests (:func:`tuner.capacity_probe.step_replay`'s stream, built
once) in virtual time (:func:`tuner.sim.landscape.evaluate`) with and without fp8 weights.

The simulator models fp8 weights as fewer bytes streamed per step
(:func:`tuner.memory.weight_bytes`) and its per-token cost divided by
``SpeedModel.fp8_gemm_speedup``; for each candidate value it prints the ratios and the loss
(squared log errors of both ratios at both loads), and picks the best. Ratios, not absolute
values: the simulator's own error on this profile is ``benchmarks/sim_calibration.py``'s.
Writes ``benchmarks/results/sim_fp8_weights.json``.

Usage::

    python benchmarks/sim_fp8_weights.py [--grid 1.0 1.2 ...] [--out PATH]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # runnable as a plain script from anywhere
    sys.path.insert(0, str(ROOT))

from tuner.capacity_probe import step_requests, step_workload  # noqa: E402
from tuner.checks import load_config  # noqa: E402
from tuner.config import SLOConfig  # noqa: E402
from tuner.memory import GPU_PROFILES, ModelShape  # noqa: E402
from tuner.sim.engine import SpeedModel  # noqa: E402
from tuner.sim.landscape import PreparedStream, evaluate, prepare_stream  # noqa: E402

RUNS = ROOT / "docs/gpu-runs/2026-12-02-screen-fp8-3x3"
OUT = ROOT / "benchmarks/results/sim_fp8_weights.json"
OVERRIDES = [
    "+workload=chat",
    "workload.stratify=false",  # the streams of 2026-12-02 (stratified streams came 2026-12-05)
    "workload.arrival.concurrency=256",
    "workload.num_requests=800",
    "workload.slo.tpot_ms=50",
    "objective=capacity",
]
FACTORS = (1.0, 1.5)
ARMS = {"trial0": {}, "trial1": {"quantization": "fp8"}}
GRID = (1.0, 1.3, 1.4, 1.5, 1.6, 1.7, 2.0)


def real_points() -> dict[float, dict[str, dict[str, float]]]:
    """Per load factor and arm: the mean TPOT p50 and output tok/s of its servers' held steps."""
    out: dict[float, dict[str, dict[str, float]]] = {}
    for f in FACTORS:
        out[f] = {}
        for arm in ARMS:
            held = [
                s
                for path in sorted(RUNS.glob(f"capacity-*-{arm}.json"))
                for s in json.loads(path.read_text())["steps"]
                if s["held"] and math.isclose(s["factor"], f)
            ]
            if not held:
                raise SystemExit(f"no held step of {arm} at {f}x in {RUNS}")
            out[f][arm] = {
                "tpot_p50_ms": statistics.fmean(s["tpot_p50_ms"] for s in held),
                "output_throughput": statistics.fmean(s["output_throughput"] for s in held),
                "servers": float(len(held)),
            }
    return out


@dataclasses.dataclass(frozen=True)
class Steps:
    """The capacity steps the simulator replays: each load factor's stream and concurrency,
    built once for every candidate constant."""

    shape: ModelShape
    slo: SLOConfig
    streams: dict[float, tuple[PreparedStream, int]]


def steps() -> Steps:
    with tempfile.TemporaryDirectory(prefix="sim-fp8-") as tmp:
        cfg = load_config([*OVERRIDES, f"paths.output_dir={tmp}", f"paths.state_dir={tmp}"])
    streams = {}
    for f in FACTORS:
        w = step_workload(cfg.objective, cfg.workload, f, closed=True)
        requests = step_requests(w, cfg.model.files, closed=True)
        streams[f] = (prepare_stream(requests, w.system_prompt_tokens), w.arrival.concurrency)
    return Steps(ModelShape.from_dir(cfg.model.files), cfg.workload.slo, streams)


def simulate(st: Steps, gemm: float) -> dict[float, dict[str, dict[str, float]]]:
    """The simulator's TPOT p50 and output tok/s per load factor and arm at ``gemm``."""
    base = dataclasses.replace(SpeedModel(), fp8_gemm_speedup=gemm)
    out: dict[float, dict[str, dict[str, float]]] = {}
    for f, (stream, concurrency) in st.streams.items():
        out[f] = {}
        for arm, params in ARMS.items():
            res = evaluate(
                st.shape,
                GPU_PROFILES["h200"],
                params,
                stream,
                concurrency=concurrency,
                slo=st.slo,
                speed_base=base,
            )
            out[f][arm] = {
                "tpot_p50_ms": res.tpot_p50_ms,
                "output_throughput": res.output_throughput,
            }
    return out


def ratios(points: dict[float, dict[str, dict[str, float]]]) -> dict[float, dict[str, float]]:
    """fp8 / defaults per load factor and metric."""
    return {
        f: {k: arms["trial1"][k] / arms["trial0"][k] for k in ("tpot_p50_ms", "output_throughput")}
        for f, arms in points.items()
    }


def loss(real: dict[float, dict[str, float]], sim: dict[float, dict[str, float]]) -> float:
    return sum(math.log(sim[f][k] / real[f][k]) ** 2 for f in real for k in real[f])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grid", type=float, nargs="+", default=list(GRID))
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    real = ratios(real_points())
    t0 = time.perf_counter()
    st = steps()
    rows = []
    for g in args.grid:
        sim = ratios(simulate(st, g))
        rows.append({"fp8_gemm_speedup": g, "sim": sim, "loss": loss(real, sim)})
    best = min(rows, key=lambda r: r["loss"])
    head = "  ".join(f"{f}x TPOT p50  {f}x tok/s" for f in FACTORS)
    print("fp8 weights / vLLM's defaults, chat at 256 in flight (H200 2026-12-02, 3 + 3 servers)")
    print(f"{'':>14}  {head}   loss")
    cells = "  ".join(
        f"{real[f]['tpot_p50_ms']:>12.3f}  {real[f]['output_throughput']:>9.3f}" for f in FACTORS
    )
    print(f"{'real':>14}  {cells}")
    for r in rows:
        s = r["sim"]
        cells = "  ".join(
            f"{s[f]['tpot_p50_ms']:>12.3f}  {s[f]['output_throughput']:>9.3f}" for f in FACTORS
        )
        mark = "  <- best" if r is best else ""
        label = f"sim, gemm {r['fp8_gemm_speedup']:.2f}"
        print(f"{label:>14}  {cells}   {r['loss']:.4f}{mark}")
    result: dict[str, Any] = {
        "source": str(RUNS.relative_to(ROOT)),
        "overrides": OVERRIDES,
        "factors": list(FACTORS),
        "real": {str(f): v for f, v in real.items()},
        "grid": [{**r, "sim": {str(f): v for f, v in r["sim"].items()}} for r in rows],
        "best_fp8_gemm_speedup": best["fp8_gemm_speedup"],
        "elapsed_s": round(time.perf_counter() - t0, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(
        f"best fp8_gemm_speedup {best['fp8_gemm_speedup']}; wrote {args.out} "
        f"({result['elapsed_s']} s)"
    )


if __name__ == "__main__":
    main()
