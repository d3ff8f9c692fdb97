"""A stored screen's lever table again, each server's capacity re-derived from its recorded steps
(``RUNS_DIR/<run>/trial_NNNN/capacity.json``) with today's ``tuner.capacity.from_steps``: the
estimator of the run's code may differ (a server whose steps were not kept counts as
stored). Each lever against the defaults as ``mode=screen`` compares them
(``tuner.screen.change``, its floor from the stored ``rel_width``, else ``--rel-width``: the
run's ``objective.capacity.rel_width``, which studies before 2026-12-06 did not store).

    python scripts/gpu/screen_again.py OPTUNA_DB RUNS_DIR [--rel-width 0.05]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tuner import stored_trial  # noqa: E402
from tuner.capacity import from_steps, rps_text  # noqa: E402
from tuner.screen import DEFAULTS, bracket_floor, change, word  # noqa: E402
from tuner.stored_study import stored_rel_width  # noqa: E402
from tuner.study_card import read_steps  # noqa: E402
from tuner.verdict import pct  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("db")
    ap.add_argument("runs", type=Path)
    ap.add_argument("--rel-width", type=float, default=0.05, help="where the study stored none")
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{args.db}"
    (summary,) = optuna.get_all_study_summaries(storage)
    study = optuna.load_study(study_name=summary.study_name, storage=storage)
    arms: dict[str, list[tuple[str | None, float]]] = {}
    servers: list[dict[str, object]] = []
    for t in study.trials:
        arm = stored_trial.screen_arm(t)
        tdir = stored_trial.trial_dir(t, here=False)
        if arm is None or tdir is None or stored_trial.failure_reason(t):
            continue
        stored = stored_trial.metric(t, "capacity_rps")
        if stored is None:
            continue
        steps = read_steps(args.runs / tdir.parent.name / tdir.name)
        if not steps:  # its steps were not kept: the stored value, said so
            arms.setdefault(arm, []).append((stored_trial.machine(t), stored))
            print(f"trial {t.number} {arm}: {rps_text(stored)} req/s as stored (no capacity.json)")
            servers.append({"trial": t.number, "arm": arm, "stored": stored, "steps": False})
            continue
        again = from_steps(steps)
        arms.setdefault(arm, []).append((stored_trial.machine(t), again.rps))
        print(
            f"trial {t.number} {arm}: {rps_text(again.rps)} req/s"
            f" [{rps_text(again.low)}-{rps_text(again.high)}] (stored {rps_text(stored)})"
        )
        servers.append({"trial": t.number, "arm": arm, "stored": stored, **again.metrics()})
    out: dict[str, object] = {"servers": servers}
    rel_width = stored_rel_width(study) or args.rel_width
    floor = bracket_floor(rel_width)
    base = arms.get(DEFAULTS, [])
    for arm, caps in arms.items():
        if arm == DEFAULTS:
            continue
        g = change(caps, base, floor)
        interval = (
            f"95 % CI {pct(g.low)} … {pct(g.high)} %" if g.low is not None and g.high is not None
            else g.why or ""
        )  # fmt: skip
        point = f"{pct(g.value)} %" if g.value is not None else "no value"
        print(f"{arm}: {point} ({interval}; {len(caps)} and {len(base)} servers) -> {word(g)}")
        out[arm] = {"value": g.value, "low": g.low, "high": g.high, "word": word(g)}
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
