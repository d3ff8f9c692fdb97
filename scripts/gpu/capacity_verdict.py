"""Two ``space=none objective=capacity`` studies of one workload (each trial a fresh server), the
second with a flag the first lacks: each one's SLO capacity per server and its spread, and the
gain of the first over the second with its interval and the verdict (tuner.verdict's rule).

    python scripts/gpu/capacity_verdict.py OPTUNA_DB PICK_STUDY DEFAULTS_STUDY [--min-effect 0.03]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tuner import stored_trial  # noqa: E402
from tuner.verdict import gain, pct  # noqa: E402


def capacities(db: str, name: str) -> list[dict[str, float]]:
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{db}")
    return [
        stored_trial.metrics(t)
        for t in study.trials
        if stored_trial.measured(t) and stored_trial.metric(t, "capacity_rps") is not None
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("db")
    ap.add_argument("pick")
    ap.add_argument("defaults")
    ap.add_argument("--min-effect", type=float, default=0.03)
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    out: dict[str, object] = {}
    values: dict[str, list[float]] = {}
    for name in (args.defaults, args.pick):
        rows = capacities(args.db, name)
        caps = [r["capacity_rps"] for r in rows]
        values[name] = caps
        spread = (max(caps) - min(caps)) / statistics.fmean(caps) if caps else None
        out[name] = {"capacity_rps": caps, "spread": spread, "rows": rows}
        shown = ", ".join(
            f"{r['capacity_rps']:.2f} [{r['capacity_rps_low']:.2f}-{r['capacity_rps_high']:.2f}]"
            + (" (censored)" if r.get("capacity_censored") else "")
            for r in rows
        )
        print(f"{name}: {len(caps)} fresh server(s): {shown} req/s")
        if spread is not None:
            print(f"  spread (max-min)/mean {spread:.1%}, mean {statistics.fmean(caps):.2f} req/s")
    g = gain(values[args.pick], values[args.defaults], higher=True)
    verdict = "gain" if g.claimed(args.min_effect) else "no_gain"
    interval = (
        f"95 % CI {pct(g.low)} … {pct(g.high)} %"
        if g.low is not None and g.high is not None
        else (g.why or "")
    )
    point = f"{pct(g.value)} %" if g.value is not None else "no value"
    print(
        f"{args.pick} vs {args.defaults}: {point} capacity_rps ({interval}, "
        f"{g.n_pick} and {g.n_base} servers) -> {verdict}"
    )
    out["gain"] = {"value": g.value, "low": g.low, "high": g.high, "verdict": verdict}
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
