"""The capacity card (:mod:`tuner.capacity_card`) of ``space=none objective=capacity`` studies
whose trials are fresh servers of one config each (as ``scripts/gpu/j_capacity.sh`` runs them):
every study is one config on the card, its servers the rounds of the interval, each server's
recorded steps judged again at every SLO tier.

    python scripts/gpu/capacity_card.py OPTUNA_DB RUNS DEFAULTS_STUDY [PICK_STUDY ...]
        [--out DIR] [OVERRIDE ...]

``RUNS``: the folder with the trials' ``<run>/trial_NNNN/capacity.json`` (the last two parts of
each ``trial_dir``), or a ``runs.tgz`` holding them. ``OVERRIDE``: the tuner's config overrides
that the studies ran with (the workload, its SLOs) and the card's (``plan.target_rps=500``,
``plan.gpu_hour_usd=3.5``, ``plan.slo_scales=[0.5,1,2]``). ``--out DIR``: also write
``capacity_card.json`` and ``capacity_card.html`` (+ ``plotly.min.js``) there.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tarfile
import tempfile
from dataclasses import replace
from pathlib import Path

import optuna
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tuner import stored_trial  # noqa: E402
from tuner.capacity_card import Entry, make_card  # noqa: E402
from tuner.checks import load_config  # noqa: E402
from tuner.config import TunerConfig  # noqa: E402
from tuner.study_card import (  # noqa: E402
    entry,
    gpus_per_server,
    print_card,
    read_steps,
    slo_limits,
    target_of,
)


def study_entry(db: str, name: str, runs: Path, cfg: TunerConfig, baseline: bool) -> Entry:
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{db}")
    searches, tokens = [], []
    for t in study.trials:
        tdir = stored_trial.trial_dir(t, here=False)
        if not stored_trial.measured(t) or tdir is None:
            continue
        steps = read_steps(runs / tdir.parent.name / tdir.name)
        if steps:
            searches.append(steps)
            if (v := stored_trial.metric(t, "output_tokens_mean")) is not None:
                tokens.append(v)
    if not searches:
        raise SystemExit(f"study {name}: no trial has capacity steps under {runs}")
    first = study.trials[0]
    gpus = gpus_per_server(first.params, cfg.model.fixed_args)
    label = f"{name} ({len(searches)} servers)"
    tok = statistics.fmean(tokens) if tokens else None
    return entry(first.number, label, baseline, gpus, searches, cfg, (), tok)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("db")
    ap.add_argument("runs", type=Path)
    ap.add_argument("defaults")
    ap.add_argument("picks", nargs="*")
    ap.add_argument("--out", type=Path, default=None)
    args, overrides = ap.parse_known_args()
    picks = [p for p in args.picks if "=" not in p]
    overrides += [p for p in args.picks if "=" in p]
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config([*overrides, f"paths.output_dir={tmp}", "objective=capacity"])
        runs = args.runs
        if runs.is_file():
            with tarfile.open(runs) as tar:
                tar.extractall(tmp, filter="data")
            runs = Path(tmp)
        entries = [study_entry(args.db, args.defaults, runs, cfg, True)]
        entries += [study_entry(args.db, p, runs, cfg, False) for p in picks]
    # one trial number per study: entries are told apart by their place
    entries = [
        Entry(i, e.label, e.baseline, e.gpus_per_server, e.tiers, e.output_tokens_per_request)
        for i, e in enumerate(entries)
    ]
    p = cfg.plan
    scales = sorted({*p.slo_scales, 1.0})
    target, source = target_of(cfg)
    card = make_card(entries, slo_limits(cfg), scales, target, p.gpu_hour_usd)
    card = replace(card, target_source=source)
    print_card(card, Console(width=200))
    if args.out is not None:
        from tuner.plots import card_data, card_figure

        args.out.mkdir(parents=True, exist_ok=True)
        data = card.as_dict()
        (args.out / "capacity_card.json").write_text(json.dumps(data, indent=2) + "\n")
        fig = card_figure(card_data(data), data["slo"], data["target_rps"], "H200: capacity card")
        fig.write_html(args.out / "capacity_card.html", include_plotlyjs="directory")
        print(f"written to {args.out}")


if __name__ == "__main__":
    main()
