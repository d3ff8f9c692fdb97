"""How many confirm servers ``confirm.stop_losers`` and ``confirm.stop_winner`` save, and whether
they change a verdict (issue #29: the quick start's confirm stage is most of its time when it
confirms 4 configs).

Usage::

    python benchmarks/confirm_stop.py [DB ...] [--seeds 0,1] [--out PATH] [-- TUNER OVERRIDES...]

Each ``DB`` is a stored study's SQLite file (``outputs/state/optuna.db``) whose confirm stage ran
3 rounds or more; ``--seeds`` first runs the README's quick start once per seed, with
``confirm.stop_losers=false confirm.stop_winner=false`` so that every pick runs every round::

    python -m tuner +workload=chat engine=sim study.n_trials=12 tracking=none study.seed=S \\
        confirm.stop_losers=false confirm.stop_winner=false [OVERRIDES...]

For every pick of every study, on the rounds 1-2 of it and of vLLM's defaults, the stop's
question before round 3: does its 95 % interval lie wholly below ``confirm.min_effect``?

- **welch**: the interval of the pick's and the defaults' rounds alone (Welch's t, the verdict's
  interval; :func:`tuner.verdict.gain_by_machine`), as ``settled_below`` was until 2026-12-06;
- **pooled** (as shipped): :func:`tuner.confirm_stop.settled_below`, the spread between fresh
  servers pooled over every config of the stage.

A settled pick runs no round 3 and, once every pick has, neither do the defaults. Per study it
shows the servers each rule saves and the verdict (kind, recommended trial) with the stopped
rounds left out, against the verdict on every round: a stop must never change it (the check).

- **winner** (``confirm.stop_winner``, looked at before the losers' stop, as shipped): is the
  verdict on rounds 1-2 of every config a gain settled above ``min_effect``
  (:func:`tuner.confirm_stop.settled_winner`)? Then no config runs round 3 or later; its
  ``shipped`` entry is both stops together. It may change the recommended trial among settled
  gains (reported, not a failed check) but must keep a gain a gain.
Prints a table and writes ``benchmarks/results/confirm_stop.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _cli import run_tuner, split_overrides  # noqa: E402

COMMAND = ["+workload=chat", "engine=sim", "study.n_trials=12", "tracking=none"]
RULES = ("welch", "pooled")
STOPS = ("confirm.stop_losers=false", "confirm.stop_winner=false")


def load(db: Path) -> tuple[str, Any]:
    """The study of ``db`` that stored a confirm stage, and its record."""
    import optuna

    from tuner.stored_study import ConfirmRecord

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{db}"
    for s in optuna.get_all_study_summaries(storage):
        study = optuna.load_study(study_name=s.study_name, storage=storage)
        record = ConfirmRecord.from_study(study)
        if record is not None and record.results:
            return s.study_name, record
    raise SystemExit(f"{db}: no study with a confirm stage")


def analyse(name: str, record: Any) -> dict[str, Any]:
    """The stop's decision before round 3 for each pick under both rules, and the verdicts."""
    from tuner.config import ObjectiveConfig, ObjectiveSpec
    from tuner.confirm import round_machines, round_values, verdict
    from tuner.confirm_stop import settled_below, settled_winner
    from tuner.records import TrialResult
    from tuner.verdict import gain_by_machine

    metric, higher = "capacity_rps", True
    objective = ObjectiveConfig(objectives=[ObjectiveSpec(metric, "maximize")])
    effect = record.min_effect if record.min_effect is not None else 0.03
    by_trial = {r.trial: r for r in record.results}
    cands = [c for c in record.candidates if c.trial in by_trial]
    base = next(c for c in cands if c.baseline)

    def first_two(trial: int) -> list[tuple[int, int, TrialResult]]:
        r = by_trial[trial]
        values = round_values(r, metric, higher)[:2]
        machines = round_machines(r)[:2]
        return [
            (
                i + 1,
                1,
                TrialResult(trial, {}, (), (v,), {}, {metric: v}, launched=True, machine=m),
            )  # fmt: skip
            for i, (v, m) in enumerate(zip(values, machines, strict=True))
            if v is not None
        ]

    def pairs(trial: int) -> list[tuple[str | None, float]]:
        return [(r.machine, float(r.metrics[metric])) for _, _, r in first_two(trial)]

    picks = []
    for c in cands:
        if c.baseline:
            continue
        rest = [(o, first_two(o.trial)) for o in cands if o.trial not in (c.trial, base.trial)]
        pooled = settled_below(
            c, first_two(c.trial), base, first_two(base.trial), objective, effect, rest
        )
        w = gain_by_machine(pairs(c.trial), pairs(base.trial), higher)
        welch = w.high is not None and w.high < effect and len(pairs(c.trial)) >= 2
        picks.append({
            "trial": c.trial, "picks": list(c.picks),
            "rounds_rps": [round(v, 2) for v in round_values(by_trial[c.trial], metric, higher)
                           if v is not None],
            "welch": welch, "welch_high": w.high,
            "pooled": pooled is not None,
        })  # fmt: skip
    full = verdict(record.results, record.candidates, objective, effect, record.rounds)
    out: dict[str, Any] = {
        "study": name,
        "configs": len(cands),
        "rounds": record.rounds,
        "defaults_rps": [
            round(v, 2) for v in round_values(by_trial[base.trial], metric, higher) if v is not None
        ],
        "picks": picks,
        "verdict_all_rounds": [full.kind, full.recommended],
    }
    first = {  # each candidate's rounds 1-2: what a stop before round 3 leaves
        r.trial: replace(r, runs=tuple(x for x in r.runs if int(x.get("round", 1)) < 3))
        for r in record.results
    }
    for rule in RULES:
        stopped = {p["trial"] for p in picks if p[rule]}
        if stopped and len(stopped) == len(picks):
            stopped.add(base.trial)
        kept = [first[r.trial] if r.trial in stopped else r for r in record.results]
        v = verdict(kept, record.candidates, objective, effect, record.rounds)
        out[rule] = {
            "servers_saved": len(stopped) * max(0, record.rounds - 2),
            "verdict": [v.kind, v.recommended],
            "same_verdict": (v.kind, v.recommended) == (full.kind, full.recommended),
        }
    won = settled_winner(record.candidates, list(first.values()), objective, effect, record.rounds)
    if won is not None:
        gained = won.gain
        out["winner"] = {
            "fired": True,
            "servers_saved": len(cands) * max(0, record.rounds - 2),
            "gain": None if gained is None else [gained.value, gained.low, gained.high],
            "verdict": [won.kind, won.recommended],
            "same_verdict": (won.kind, won.recommended) == (full.kind, full.recommended),
            "still_gain": full.kind == "gain",
        }
    else:
        out["winner"] = {"fired": False, "servers_saved": 0}
    out["shipped"] = out["winner"] if won is not None else out["pooled"]
    return out


def main(argv: list[str] | None = None) -> int:
    own, overrides = split_overrides(argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dbs", nargs="*", type=Path, help="stored studies' optuna.db files")
    ap.add_argument("--seeds", default="", help="run the quick start once per seed first")
    ap.add_argument("--timeout-s", type=float, default=900.0)
    ap.add_argument("--out", type=Path, help="default benchmarks/results/confirm_stop.json")
    args = ap.parse_args(own)
    out = args.out or ROOT / "benchmarks" / "results" / "confirm_stop.json"
    dbs = list(args.dbs)
    studies = []
    with tempfile.TemporaryDirectory(prefix="confirm_stop-") as tmp:
        for seed in [int(s) for s in args.seeds.split(",") if s]:
            work = Path(tmp) / f"seed_{seed}"
            work.mkdir()
            print(f"seed {seed}: the quick start, every round", flush=True)
            p = run_tuner(
                [*COMMAND, f"study.seed={seed}", *STOPS, *overrides],
                work,
                args.timeout_s,
            )
            if p.returncode != 0:
                raise SystemExit(f"the quick start failed:\n{p.stderr[-3000:]}")
            dbs.append(work / "outputs" / "state" / "optuna.db")
        if not dbs:
            ap.error("no study: give DB paths or --seeds")
        for db in dbs:
            name, record = load(db)
            if record.rounds < 3:
                print(f"{db}: {record.rounds} rounds, no third to stop: left out")
                continue
            studies.append({"db": str(db), **analyse(name, record)})
    if not studies:
        raise SystemExit("no confirm stage of 3 rounds or more to analyse")
    summary = {
        rule: {
            "picks_settled": sum(p[rule] for s in studies for p in s["picks"]),
            "servers_saved": sum(s[rule]["servers_saved"] for s in studies),
            "verdicts_changed": sum(not s[rule]["same_verdict"] for s in studies),
        }
        for rule in RULES
    }
    fired = [s["winner"] for s in studies if s["winner"]["fired"]]
    summary["winner"] = {
        "stages_stopped": len(fired),
        "servers_saved": sum(w["servers_saved"] for w in fired),
        "recommendations_changed": sum(not w["same_verdict"] for w in fired),
        "gains_lost": sum(not w["still_gain"] for w in fired),
    }
    summary["shipped"] = {
        "servers_saved": sum(s["shipped"]["servers_saved"] for s in studies),
        "servers": sum(s["configs"] * s["rounds"] for s in studies),
    }
    checks = {
        "no_verdict_changed": summary["pooled"]["verdicts_changed"] == 0,
        "no_gain_lost": summary["winner"]["gains_lost"] == 0,
    }
    doc = {
        "command": " ".join(["python benchmarks/confirm_stop.py", *own, "--", *overrides]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpus": os.cpu_count(),
        "studies": studies,
        "picks": sum(len(s["picks"]) for s in studies),
        "servers": sum(s["configs"] * s["rounds"] for s in studies),
        "summary": summary,
        "checks": checks,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print_table(doc)
    print(f"wrote {out}")
    return 0 if all(checks.values()) else 1


def print_table(doc: dict[str, Any]) -> None:
    print(f"{'study':<10} {'configs':>7} {'pick':<22} {'rounds req/s':<24} {'welch':>6} "
          f"{'pooled':>6}")  # fmt: skip
    for s in doc["studies"]:
        parts = Path(s["db"]).parts  # a run's outputs/state/optuna.db, or a record's folder
        label = parts[-4] if parts[-3:-1] == ("outputs", "state") else parts[-2][-10:]
        for p in s["picks"]:
            rps = " / ".join(f"{v:.1f}" for v in p["rounds_rps"])
            w, q = ("stop" if p[r] else "-" for r in RULES)
            print(f"{label:<10} {s['configs']:>7} {', '.join(p['picks']):<22} {rps:<24} "
                  f"{w:>6} {q:>6}")  # fmt: skip
        d = " / ".join(f"{v:.1f}" for v in s["defaults_rps"])
        print(f"{label:<10} {'':>7} {'(defaults)':<22} {d:<24}   verdict {s['verdict_all_rounds']}"
              f", welch {s['welch']['verdict']}, pooled {s['pooled']['verdict']}")  # fmt: skip
        w = s["winner"]
        if w["fired"]:
            g = ", ".join(f"{100 * x:+.1f} %" for x in w["gain"])
            print(f"{label:<10} {'':>7} stop_winner after 2 rounds: {w['verdict']} (gain, low, "
                  f"high: {g}), {w['servers_saved']} servers saved")  # fmt: skip
    print(f"{doc['picks']} picks in {len(doc['studies'])} studies, {doc['servers']} servers:")
    for rule in RULES:
        v = doc["summary"][rule]
        print(f"  {rule}: {v['picks_settled']} picks settled before round 3, "
              f"{v['servers_saved']} servers saved, "
              f"{v['verdicts_changed']} verdicts changed")  # fmt: skip
    w, both = doc["summary"]["winner"], doc["summary"]["shipped"]
    print(f"  winner: {w['stages_stopped']} stages stopped after 2 rounds, {w['servers_saved']} "
          f"servers saved, {w['recommendations_changed']} recommendations changed, "
          f"{w['gains_lost']} gains lost")  # fmt: skip
    print(
        f"  shipped (winner, else pooled): {both['servers_saved']} of {both['servers']} servers "
        "saved"
    )


if __name__ == "__main__":
    raise SystemExit(main())
