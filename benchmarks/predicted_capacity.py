"""The simulator's capacity prediction against the SLO capacities real servers measured.

Every point of a calibration file that carries a measured ``capacity_rps`` (``--data``, default
``benchmarks/calibration/h100-qwen3-8b.json``, made by ``scripts/calibration_points.py --gpu
h100``: one point per H100 server) is grouped by workload and config; each group's capacity is
predicted once, as before a real server's capacity search (``objective.capacity.predict_start``,
:func:`tuner.prescreen.predict_capacity`): the simulator's landscape on the file's GPU profile
(``engine.gpu``) searches the same workload and SLO in virtual time. Printed per group: the
servers, their measured capacities (min–max, median; ``≥`` where a search ended holding), the
prediction and its error against the median. A prediction only tells a search where to go after
its first replay (a loss there caps nothing): its error costs replays, not a wrong capacity.

Usage::

    python benchmarks/predicted_capacity.py [--data PATH] [--out PATH]

Writes ``benchmarks/results/predicted_capacity-h100.json`` (or ``--out``). No target.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # runnable as a plain script from anywhere
    sys.path.insert(0, str(ROOT))

from tuner.checks import load_config  # noqa: E402
from tuner.config import TunerConfig  # noqa: E402
from tuner.memory import ModelShape  # noqa: E402
from tuner.prescreen import predict_capacity  # noqa: E402
from tuner.records import RequestSpec  # noqa: E402
from tuner.workload import build_requests  # noqa: E402

DATA = ROOT / "benchmarks/calibration/h100-qwen3-8b.json"
OUT = ROOT / "benchmarks/results/predicted_capacity-h100.json"
MODEL_DIR = ROOT / "models/qwen3-8b-dummy"
EXTRA = {"+workload=long_docs": ["objective.capacity.rel_width=0.1"]}
"""Overrides the GPU runs gave a workload besides its load (long_docs' screens, levers.md)."""


@functools.cache
def _workload(overrides: tuple[str, ...], gpu: str) -> tuple[TunerConfig, list[RequestSpec]]:
    """The config and request stream of ``overrides``' workload on ``gpu``, composed once."""
    with tempfile.TemporaryDirectory(prefix="pred-cap-") as tmp:
        cfg = load_config(
            [
                *overrides,
                *EXTRA.get(overrides[0], []),
                "engine=sim",
                f"engine.gpu={gpu}",
                "mode=screen",  # its space passes every lever's flag, as the GPU runs' did
                f"paths.output_dir={tmp}",
                f"paths.state_dir={tmp}",
            ]
        )
    return cfg, build_requests(cfg.workload, cfg.model.files)


def predicted(
    shape: ModelShape, overrides: Sequence[str], gpu: str, params: dict[str, Any]
) -> float | None:
    """The simulator's SLO capacity (req/s) for ``params`` on ``overrides``' workload, or None."""
    cfg, requests = _workload(tuple(overrides), gpu)
    cap = asyncio.run(predict_capacity(cfg, shape, requests, params))
    return cap.rps if cap is not None and cap.rps > 0 else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    data = json.loads(args.data.read_text())
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for p in data["points"]:
        if p["measured"].get("capacity_rps"):
            groups[(p["group"], json.dumps(p["params"], sort_keys=True))].append(p)
    t0 = time.perf_counter()
    shape = ModelShape.from_dir(MODEL_DIR)
    rows = []
    for (group, params), points in sorted(groups.items()):
        caps = [p["measured"]["capacity_rps"] for p in points]
        censored = sum(bool(p["measured"].get("capacity_censored")) for p in points)
        med = statistics.median(caps)
        rps = predicted(shape, points[0]["workload"]["overrides"], data["gpu"], json.loads(params))
        rows.append(
            {
                "group": group,
                "params": json.loads(params),
                "servers": len(caps),
                "censored": censored,
                "measured_min": min(caps),
                "measured_max": max(caps),
                "measured_median": med,
                "predicted": rps,
                "error": None if rps is None else rps / med - 1.0,
            }
        )
    print(f"{'workload':18s} {'config':48s} servers  measured req/s (median)   predicted  error")
    for r in rows:
        config = ", ".join(f"{k}={v}" for k, v in r["params"].items()) or "vLLM's defaults"
        ge = "≥" if r["censored"] else " "
        span = f"{ge}{r['measured_min']:.3g}–{r['measured_max']:.3g} ({r['measured_median']:.3g})"
        pred = "none" if r["predicted"] is None else f"{r['predicted']:.3g}"
        err = "" if r["error"] is None else f"{r['error']:+.1%}"
        print(f"{r['group']:18s} {config:48s} {r['servers']:7d}  {span:24s} {pred:>10s}  {err}")
    errs = [abs(r["error"]) for r in rows if r["error"] is not None]
    med, worst = statistics.median(errs), max(errs)
    print(f"\n{len(rows)} groups, |error| median {med:.1%}, max {worst:.1%}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    data_path = args.data.relative_to(ROOT) if args.data.is_relative_to(ROOT) else args.data
    out = {"data": str(data_path), "gpu": data["gpu"], "rows": rows}
    out["seconds"] = time.perf_counter() - t0
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out} ({out['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
