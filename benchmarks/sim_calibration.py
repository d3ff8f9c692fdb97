"""The simulator against real H200 runs: error per calibration point, and a fit of its speed model.

``--data benchmarks/calibration/h100-qwen3-8b.json`` evaluates the H100 servers' points instead,
on the file's GPU profile (``gpu``: ``h100``), out of sample (docs/sim-calibration.md, "The H100").

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
TP/model scaling of :meth:`SpeedModel.for_model` is kept) by scipy's Nelder-Mead on log-constants,
minimising the sum of squared log errors of tok/s, TTFT p50 and (half weight) TPOT p50 over the
TP=1 points (scipy's standard coefficients; initial simplex +0.3 per log-constant; it stops at
``--max-evals`` or when the simplex spans < 1e-3 in log space and < 1e-4 in loss), and prints the
errors before and after. ``--start`` fits from the constants of an earlier result file instead of
``SpeedModel``'s defaults. Writes ``benchmarks/results/sim_calibration.json``.

Usage::

    python benchmarks/sim_calibration.py [--fit] [--max-evals 300] [--start RESULT]
        [--points ID ...] [--out PATH]
    python benchmarks/sim_calibration.py --markdown RESULT   # the doc's tables from a result file
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
from scipy.optimize import OptimizeResult, minimize

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # runnable as a plain script from anywhere
    sys.path.insert(0, str(ROOT))

from tuner.checks import load_config  # noqa: E402
from tuner.config import SLOConfig  # noqa: E402
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
    """The file's points, each with the file's ``gpu`` (a :data:`GPU_PROFILES` key)."""
    data = json.loads(path.read_text())
    points: list[dict[str, Any]] = [p | {"gpu": data.get("gpu", "h200")} for p in data["points"]]
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
            # the streams the H200 ran: every point was measured before 2026-12-05, on
            # independent draws (a point's own overrides come after, and may say otherwise)
            cfg = load_config(
                [
                    "workload.stratify=false",
                    *workload["overrides"],
                    f"paths.output_dir={tmp}",
                    f"paths.state_dir={tmp}",
                ]
            )
        w = cfg.workload
        reqs = build_requests(w, cfg.model.files)
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
        GPU_PROFILES[case.point.get("gpu", "h200")],
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


NM_STEP = 0.3
"""Initial simplex: the start and one vertex per constant at +0.3 in log space (x 1.35)."""
NM_XATOL = 1e-3
"""Simplex size at which the fit stops, in log space: 0.1 %, below the 3-digit rounding."""
NM_FATOL = 1e-4
"""Loss spread over the simplex at which the fit stops (with ``NM_XATOL``)."""


def fit_constants(
    f: Callable[[np.ndarray], float], x0: np.ndarray, max_evals: int
) -> OptimizeResult:
    """Minimise ``f`` over log-constants from ``x0``: scipy's Nelder-Mead (standard coefficients),
    stopping at ``max_evals`` evaluations or when the simplex spans less than ``NM_XATOL`` and its
    losses less than ``NM_FATOL``."""
    simplex = np.vstack([x0, x0 + NM_STEP * np.eye(len(x0))])
    return minimize(
        f,
        x0,
        method="Nelder-Mead",
        options={
            "initial_simplex": simplex,
            "maxfev": max_evals,
            "xatol": NM_XATOL,
            "fatol": NM_FATOL,
        },
    )


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


MD_METRICS = {
    "output_throughput": "output tok/s",
    "ttft_p50_ms": "TTFT p50",
    "tpot_p50_ms": "TPOT p50",
    "ttft_p95_ms": "TTFT p95",
    "kv_tokens": "KV tokens",
}


def _median_abs(rows: Sequence[Mapping[str, Any]], k: str) -> float | None:
    errs = [abs(r["error"][k]) for r in rows if k in r["error"]]
    return statistics.median(errs) if errs else None


def markdown(result: Mapping[str, Any]) -> str:
    """The tables of ``docs/sim-calibration.md`` from a result file: the fitted constants' errors
    with, in brackets, those of the start (``rows``); without a fit, the start's alone."""
    before: list[dict[str, Any]] = result["rows"]
    after: list[dict[str, Any]] = result["fit"]["rows"] if "fit" in result else before
    fitted = "fit" in result

    def pct(e: float | None, digits: int = 0) -> str:
        return "—" if e is None else f"{e:+.{digits}%}"

    def cell(a: Mapping[str, Any], b: Mapping[str, Any], k: str) -> list[str]:
        if k not in a["error"]:
            return ["—"] * 3
        err = pct(a["error"][k]) + (f" ({pct(b['error'][k])})" if fitted else "")
        return [_fmt(a["real"][k], k), _fmt(a["sim"][k], k), err]

    note = " (before)" if fitted else ""
    head = ["point"]
    for name in ("tok/s", "TTFT p50", "TPOT p50"):
        head += [f"{name} real", "sim", f"err{note}"]
    head += ["KV real", "KV model", "err"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for a, b in zip(after, before, strict=True):
        row = [f"`{a['id']}`"]
        for k in ("output_throughput", "ttft_p50_ms", "tpot_p50_ms"):
            row += cell(a, b, k)
        kv = a["error"].get("kv_tokens")
        if kv is None:
            row += ["—"] * 3
        else:
            row += [_fmt(a["real"]["kv_tokens"], "kv_tokens")]
            row += [_fmt(a["sim"]["kv_tokens"], "kv_tokens"), pct(kv, 1)]
        lines.append("| " + " | ".join(row) + " |")

    sa, sb = summary(after), summary(before)
    lines += ["", f"| metric | points | max abs. error{note} | median{note} "
              f"| within target{note} |", "|---|---|---|---|---|"]  # fmt: skip
    for k, name in MD_METRICS.items():
        if k not in sa:
            continue
        a, b = sa[k], sb[k]
        mx = f"{a['max']:.1%}" + (f" ({b['max']:.1%})" if fitted else "")
        med = f"{a['median']:.1%}" + (f" ({b['median']:.1%})" if fitted else "")
        tgt = "—"
        if k in TARGET:
            tgt = f"{a['within_target']}/{a['n']} within ±{TARGET[k]:.0%}"
            tgt += f" ({b['within_target']}/{b['n']})" if fitted else ""
        lines.append(f"| {name} | {a['n']} | {mx} | {med} | {tgt} |")

    if fitted:
        groups: dict[str, list[int]] = {}
        for i, r in enumerate(after):
            groups.setdefault(r["group"], []).append(i)
        short = [i for i, r in enumerate(after) if not r["group"].startswith("long_docs")]
        sets = [(f"`{g}`", idx) for g, idx in groups.items()]
        sets.append((f"the {len(short)} short-context points", short))
        sets.append(("all", list(range(len(after)))))
        cols = ("output_throughput", "ttft_p50_ms", "tpot_p50_ms")
        lines += ["", "| group | points | tok/s before → after | TTFT p50 before → after "
                  "| TPOT p50 before → after |", "|---|---|---|---|---|"]  # fmt: skip
        for name, idx in sets:
            row = [name, str(len(idx))]
            for k in cols:
                mb = _median_abs([before[i] for i in idx], k)
                ma = _median_abs([after[i] for i in idx], k)
                row.append("—" if mb is None or ma is None else f"{mb:.1%} → {ma:.1%}")
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--points", nargs="*", help="only these point ids")
    ap.add_argument("--fit", action="store_true", help="fit SpeedModel's constants first")
    ap.add_argument(
        "--max-evals", type=int, default=300,
        help="the fit's evaluation budget (it stops earlier once the simplex has converged)",
    )  # fmt: skip
    ap.add_argument(
        "--start", type=Path, metavar="RESULT",
        help="evaluate (and fit from) the constants a result file started from, not the defaults",
    )  # fmt: skip
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument(
        "--markdown", type=Path, metavar="RESULT",
        help="print docs/sim-calibration.md's tables from a result file written earlier, and exit",
    )  # fmt: skip
    args = ap.parse_args()
    if args.markdown:
        print(markdown(json.loads(args.markdown.read_text())))
        return

    points = load_points(args.data, args.points)
    t0 = time.perf_counter()
    ev = Evaluator(points, args.jobs)
    current = SpeedModel()
    consts = {k: getattr(current, k) for k in FITTED}
    start = "SpeedModel defaults"
    if args.start:
        consts = {k: float(json.loads(args.start.read_text())["constants"][k]) for k in FITTED}
        start = f"the constants of {args.start}"
    before = rows_for(points, ev(consts if args.start else None))
    print_table(before, f"{start} ({time.perf_counter() - t0:.0f} s)")
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

        t_fit = time.perf_counter()
        res = fit_constants(f, x0, args.max_evals)
        t_fit = time.perf_counter() - t_fit
        print(f"scipy Nelder-Mead: {res.message} ({res.nfev} evaluations, {t_fit:.0f} s)")
        fitted = {k: float(f"{v:.3g}") for k, v in zip(FITTED, np.exp(res.x), strict=True)}
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
            "optimizer": {
                "method": "scipy.optimize.minimize Nelder-Mead",
                "initial_simplex_step": NM_STEP,
                "maxfev": args.max_evals,
                "xatol": NM_XATOL,
                "fatol": NM_FATOL,
                "converged": bool(res.success),
                "message": str(res.message),
                "best_loss_unrounded": float(res.fun),
                "seconds": t_fit,
            },
        }
    ev.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nwrote {args.out} ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
