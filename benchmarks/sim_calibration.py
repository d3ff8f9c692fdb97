"""The simulator against real H200 runs: error per calibration point, and a fit of its speed model.

Every point of ``benchmarks/calibration/h200-qwen3-8b.json`` (made by
``scripts/calibration_points.py`` from the stored GPU runs) is evaluated in virtual time with
:func:`tuner.sim.landscape.evaluate` (the simulated server's scheduler, block pool and
:class:`~tuner.sim.engine.SpeedModel`) on the request stream the real run used:

- ``tuner``: the tuner's own stream, :func:`tuner.workload.build_requests` on the workload
  composed from the point's overrides (chat profile: shared system prompt, 2-turn conversations);
- ``bench``: ``benchmarks/replay_vs_vllm_bench.py``'s shape (distinct ``input_len``-token
  completions prompts, its ``output_lengths`` for the recorded seed, warm-up copies of request 0);
- ``random``: ``vllm bench serve --dataset-name random``: distinct prompts, fixed lengths.

Printed per point: real vs sim output tok/s, TTFT p50, TPOT p50 (TTFT p95 where only that was
recorded), KV tokens, and the relative error ``sim / real - 1``; then max and median absolute
error per metric. ``--fit`` first fits ``SpeedModel``'s reference constants (``FITTED``; the
TP/model scaling of :meth:`SpeedModel.for_model` is kept) by Nelder-Mead on log-constants,
minimising the sum of squared log errors of tok/s, TTFT p50 and (half weight) TPOT p50 over the
TP=1 points, and prints the errors before and after.
Writes ``benchmarks/results/sim_calibration.json``.

Usage::

    python benchmarks/sim_calibration.py [--fit] [--max-evals 150] [--points ID ...] [--out PATH]
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
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # runnable as a plain script from anywhere
    sys.path.insert(0, str(ROOT))

from tuner.config import SLOConfig, load_config  # noqa: E402
from tuner.memory import GPU_PROFILES, ModelShape  # noqa: E402
from tuner.records import RequestSpec  # noqa: E402
from tuner.sim.engine import SpeedModel  # noqa: E402
from tuner.sim.landscape import LandscapeResult, PreparedStream, evaluate, prepare_stream  # noqa: E402
from tuner.workload import build_requests  # noqa: E402

DATA = ROOT / "benchmarks/calibration/h200-qwen3-8b.json"
OUT = ROOT / "benchmarks/results/sim_calibration.json"
MODEL_DIR = ROOT / "models/qwen3-8b-dummy"
FITTED = (
    "overhead_graph_s",
    "overhead_piecewise_s",
    "overhead_eager_s",
    "per_token_s",
    "per_ctx_token_s",
    "frontend_s_per_running",
    "per_prefill_pair_s",
)
METRICS = ("output_throughput", "ttft_p50_ms", "tpot_p50_ms", "ttft_p95_ms", "kv_tokens")
TARGET = {"output_throughput": 0.15, "ttft_p50_ms": 0.15, "kv_tokens": 0.02}
"""The issue's acceptance bounds on |sim / real - 1|."""
LOSS_WEIGHTS = {"output_throughput": 1.0, "ttft_p50_ms": 1.0, "tpot_p50_ms": 0.5}


@dataclasses.dataclass(frozen=True)
class Case:
    """One point ready to evaluate: its stream, load and SLO."""

    point: Mapping[str, Any]
    stream: PreparedStream
    concurrency: int
    slo: SLOConfig


def load_points(path: Path = DATA, ids: Sequence[str] | None = None) -> list[dict[str, Any]]:
    points: list[dict[str, Any]] = json.loads(path.read_text())["points"]
    if ids:
        points = [p for p in points if p["id"] in ids]
    return points


def _completions(prompt_len: int, output_lens: Sequence[int], warmups: int) -> list[RequestSpec]:
    """Distinct completions prompts (no shared prefix), ``warmups`` copies of request 0 first."""
    n = len(output_lens)
    specs = [
        RequestSpec(i, "completions", {"prompt": f"<{i}>"}, prompt_len, k)
        for i, k in enumerate(output_lens)
    ]
    specs += [
        RequestSpec(n + k, "completions", {"prompt": "<0>"}, prompt_len, output_lens[0], True)
        for k in range(warmups)
    ]
    return specs


def _stream(workload: Mapping[str, Any]) -> tuple[PreparedStream, int, SLOConfig]:
    kind = workload["kind"]
    if kind == "tuner":
        with tempfile.TemporaryDirectory(prefix="sim-cal-") as tmp:
            cfg = load_config(
                [*workload["overrides"], f"paths.output_dir={tmp}", f"paths.state_dir={tmp}"]
            )
        w = cfg.workload
        reqs = build_requests(w, Path(cfg.model.path))
        return prepare_stream(reqs, w.system_prompt_tokens), w.arrival.concurrency, w.slo
    if kind == "bench":
        from benchmarks.replay_vs_vllm_bench import output_lengths

        lens = output_lengths(
            workload["requests"], workload["output_len"], workload["output_range_ratio"],
            workload["seed"],
        )  # fmt: skip
        specs = _completions(workload["input_len"], lens, workload["warmups"])
        return prepare_stream(specs, 0), workload["concurrency"], SLOConfig()
    if kind == "random":
        lens = [workload["output_len"]] * workload["requests"]
        specs = _completions(workload["input_len"], lens, 0)
        return prepare_stream(specs, 0), workload["concurrency"], SLOConfig()
    raise ValueError(f"unknown workload kind {kind!r}")


def prepare(points: Sequence[Mapping[str, Any]]) -> list[Case]:
    """Streams built once per distinct workload."""
    built: dict[str, tuple[PreparedStream, int, SLOConfig]] = {}
    cases = []
    for p in points:
        key = json.dumps(p["workload"], sort_keys=True)
        if key not in built:
            built[key] = _stream(p["workload"])
        cases.append(Case(p, *built[key]))
    return cases


def simulate(case: Case, base: SpeedModel | None = None) -> dict[str, float]:
    shape = ModelShape.from_dir(MODEL_DIR)
    res: LandscapeResult = evaluate(
        shape,
        GPU_PROFILES["h200"],
        case.point["params"],
        case.stream,
        concurrency=case.concurrency,
        slo=case.slo,
        speed_base=base,
    )
    if not res.feasible:
        raise RuntimeError(f"{case.point['id']}: the simulator refuses it: {res.message}")
    return {
        "output_throughput": res.output_throughput,
        "ttft_p50_ms": res.ttft_p50_ms,
        "tpot_p50_ms": res.tpot_p50_ms,
        "ttft_p95_ms": res.ttft_p95_ms,
        "kv_tokens": float(res.kv_tokens),
        "goodput": res.goodput,
        "preemptions": float(res.preemptions),
    }


def errors(real: Mapping[str, Any], sim: Mapping[str, float]) -> dict[str, float]:
    """``sim / real - 1`` for every metric both have."""
    return {k: sim[k] / real[k] - 1.0 for k in METRICS if real.get(k) and k in sim}


def summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for k in METRICS:
        errs = [abs(r["error"][k]) for r in rows if k in r["error"]]
        if errs:
            out[k] = {
                "max": max(errs),
                "median": statistics.median(errs),
                "n": len(errs),
                "within_target": sum(e <= TARGET[k] for e in errs) if k in TARGET else -1,
            }
    return out


# --- evaluation, optionally in worker processes --------------------------------------------------

_CASES: list[Case] = []


def _init(points: list[dict[str, Any]]) -> None:
    _CASES[:] = prepare(points)


def _sim_one(args: tuple[int, dict[str, float] | None]) -> dict[str, float]:
    i, consts = args
    base = SpeedModel(**consts) if consts is not None else None
    return simulate(_CASES[i], base)


class Evaluator:
    """Simulates every point for a set of constants; worker processes when ``jobs`` > 1."""

    def __init__(self, points: list[dict[str, Any]], jobs: int) -> None:
        self.points = points
        self.pool = (
            ProcessPoolExecutor(jobs, initializer=_init, initargs=(points,)) if jobs > 1 else None
        )
        if self.pool is None:
            _init(points)

    def __call__(self, consts: dict[str, float] | None) -> list[dict[str, float]]:
        # longest first, so the two workers finish together
        order = sorted(range(len(self.points)), key=lambda i: -_cost(self.points[i]))
        args = [(i, consts) for i in order]
        sims = list(self.pool.map(_sim_one, args)) if self.pool else [_sim_one(a) for a in args]
        out: list[dict[str, float]] = [{}] * len(order)
        for i, s in zip(order, sims, strict=True):
            out[i] = s
        return out

    def close(self) -> None:
        if self.pool:
            self.pool.shutdown()


def _cost(p: Mapping[str, Any]) -> float:
    w = p["workload"]
    n = w.get("requests") or 1000
    return float(n) * (256 if w["kind"] == "random" else 128)


def rows_for(
    points: Sequence[Mapping[str, Any]], sims: Sequence[Mapping[str, float]]
) -> list[dict[str, Any]]:
    return [
        {"id": p["id"], "group": p["group"], "real": p["measured"], "sim": s,
         "error": errors(p["measured"], s)}
        for p, s in zip(points, sims, strict=True)
    ]  # fmt: skip


def fit_points(points: Sequence[Mapping[str, Any]]) -> list[int]:
    """Indices the fit uses: TP=1 (the TP scaling is not refitted)."""
    return [i for i, p in enumerate(points) if int(p["params"].get("tensor_parallel_size", 1)) == 1]


def loss(points: Sequence[Mapping[str, Any]], sims: Sequence[Mapping[str, float]]) -> float:
    total = 0.0
    for i in fit_points(points):
        real, sim = points[i]["measured"], sims[i]
        for k, wt in LOSS_WEIGHTS.items():
            if real.get(k) and sim.get(k):
                total += wt * math.log(sim[k] / real[k]) ** 2
    return total


def nelder_mead(
    f: Callable[[np.ndarray], float], x0: np.ndarray, step: float, max_evals: int
) -> tuple[np.ndarray, float]:
    """Plain Nelder-Mead (reflect 1, expand 2, contract 0.5, shrink 0.5)."""
    n = len(x0)
    simplex = [x0] + [x0 + step * np.eye(n)[i] for i in range(n)]
    vals = [f(x) for x in simplex]
    evals = n + 1
    while evals < max_evals:
        order = np.argsort(vals)
        simplex, vals = [simplex[i] for i in order], [vals[i] for i in order]
        centroid = np.mean(simplex[:-1], axis=0)
        xr = centroid + (centroid - simplex[-1])
        fr = f(xr)
        evals += 1
        if fr < vals[0]:
            xe = centroid + 2 * (centroid - simplex[-1])
            fe = f(xe)
            evals += 1
            simplex[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            simplex[-1], vals[-1] = xr, fr
        else:
            xc = centroid + 0.5 * (simplex[-1] - centroid)
            fc = f(xc)
            evals += 1
            if fc < vals[-1]:
                simplex[-1], vals[-1] = xc, fc
            else:
                for i in range(1, n + 1):
                    simplex[i] = simplex[0] + 0.5 * (simplex[i] - simplex[0])
                    vals[i] = f(simplex[i])
                evals += n
        if max(vals) - min(vals) < 1e-4:
            break
    best = int(np.argmin(vals))
    return simplex[best], vals[best]


# --- output -------------------------------------------------------------------------------------


def _fmt(v: float | None, k: str) -> str:
    if v is None:
        return "—"
    if k == "kv_tokens":
        return f"{v:,.0f}"
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


def print_table(rows: Sequence[Mapping[str, Any]], title: str) -> None:
    print(f"\n{title}")
    cols = ("output_throughput", "ttft_p50_ms", "tpot_p50_ms", "ttft_p95_ms", "kv_tokens")
    names = ("tok/s", "TTFT p50", "TPOT p50", "TTFT p95", "KV tokens")
    print(f"{'point':<36}" + "".join(f"{n:>29}" for n in names))
    for r in rows:
        line = f"{r['id']:<36}"
        for k in cols:
            real = r["real"].get(k)
            if real is None:
                line += f"{'—':>29}"
                continue
            cell = f"{_fmt(real, k)} / {_fmt(r['sim'][k], k)} {r['error'][k]:+.1%}"
            line += f"{cell:>29}"
        print(line)
    print("cells: real / sim error(sim/real-1)")
    for k, s in summary(rows).items():
        tgt = f", {s['within_target']}/{s['n']} within ±{TARGET[k]:.0%}" if k in TARGET else ""
        print(f"  {k:<18} max |err| {s['max']:6.1%}  median {s['median']:6.1%}{tgt}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--points", nargs="*", help="only these point ids")
    ap.add_argument("--fit", action="store_true", help="fit SpeedModel's constants first")
    ap.add_argument("--max-evals", type=int, default=150)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()

    points = load_points(args.data, args.points)
    t0 = time.perf_counter()
    ev = Evaluator(points, args.jobs)
    current = SpeedModel()
    consts = {k: getattr(current, k) for k in FITTED}
    before = rows_for(points, ev(None))
    print_table(before, f"SpeedModel defaults ({time.perf_counter() - t0:.0f} s)")
    result: dict[str, Any] = {
        "data": str(args.data.relative_to(ROOT) if args.data.is_relative_to(ROOT) else args.data),
        "constants": consts,
        "rows": before,
        "summary": summary(before),
        "loss": loss(points, [r["sim"] for r in before]),
    }
    if args.fit:
        x0 = np.log([consts[k] for k in FITTED])
        n_eval = 0

        def f(x: np.ndarray) -> float:
            nonlocal n_eval
            n_eval += 1
            c = dict(zip(FITTED, np.exp(x).tolist(), strict=True))
            value = loss(points, ev(c))
            print(
                f"  eval {n_eval:3d}: loss {value:.4f} " + " ".join(f"{v:.3g}" for v in c.values())
            )
            return value

        xbest, fbest = nelder_mead(f, x0, 0.3, args.max_evals)
        fitted = {k: float(f"{v:.3g}") for k, v in zip(FITTED, np.exp(xbest), strict=True)}
        after = rows_for(points, ev(fitted))
        print("\nfitted constants (3 significant digits):")
        for k in FITTED:
            print(f"  {k:<24} {consts[k]:.3g} -> {fitted[k]:.3g}")
        print(f"loss {result['loss']:.4f} -> {loss(points, [r['sim'] for r in after]):.4f}")
        print_table(before, "before the fit")
        print_table(after, "after the fit")
        result["fit"] = {
            "constants": fitted,
            "rows": after,
            "summary": summary(after),
            "loss": loss(points, [r["sim"] for r in after]),
            "evals": n_eval,
        }
    ev.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nwrote {args.out} ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
