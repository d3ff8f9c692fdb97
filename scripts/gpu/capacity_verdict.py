"""Two ``space=none objective=capacity`` studies of one workload (each trial a fresh server), the
second with a flag the first lacks: each one's SLO capacity per server and its spread, and the
gain of the first over the second with its interval and the verdict (tuner.verdict's rule).

    python scripts/gpu/capacity_verdict.py OPTUNA_DB PICK_STUDY DEFAULTS_STUDY [--min-effect 0.03]
        [--steps RUNS_DIR]

``--steps RUNS_DIR``: each trial's capacity again from its recorded steps
(``RUNS_DIR/<run>/trial_NNNN/capacity.json``, the last two parts of its ``trial_dir``) with
today's ``tuner.capacity.from_steps``: the estimator of an old run's code may differ.
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
from tuner.capacity import from_steps  # noqa: E402
from tuner.study_card import read_steps  # noqa: E402
from tuner.verdict import gain, pct  # noqa: E402


def capacities(db: str, name: str, steps_dir: Path | None = None) -> list[dict[str, float]]:
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{db}")
    rows = []
    for t in study.trials:
        if not stored_trial.measured(t) or stored_trial.metric(t, "capacity_rps") is None:
            continue
        row = dict(stored_trial.metrics(t))
        if steps_dir is not None:
            tdir = stored_trial.trial_dir(t, here=False)
            assert tdir is not None, f"trial {t.number} of {name} has no trial folder"
            recorded = read_steps(steps_dir / tdir.parent.name / tdir.name)
            assert recorded, f"trial {t.number} of {name} has no capacity.json under {steps_dir}"
            row.update(from_steps(recorded).metrics())
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("db")
    ap.add_argument("pick")
    ap.add_argument("defaults")
    ap.add_argument("--min-effect", type=float, default=0.03)
    ap.add_argument("--steps", type=Path, default=None, help="re-derive from capacity.json here")
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    out: dict[str, object] = {}
    values: dict[str, list[float]] = {}
    for name in (args.defaults, args.pick):
        rows = capacities(args.db, name, args.steps)
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
