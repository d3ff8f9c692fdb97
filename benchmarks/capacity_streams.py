"""One capacity per config whatever request stream measures it (issue #29, item 3).

Usage::

    python benchmarks/capacity_streams.py [--parts streams,servers] [--seeds 0,1,2]
        [--servers 3] [--blocks 1,8,16,32,64] [--out PATH] [--timeout-s S]
        [-- TUNER OVERRIDES...]

A capacity step counts a few hundred requests of a seeded stream (a closed loop's middle third,
``tuner.measure.unsteady_indices``), so the capacity in requests/s it measures moves with their
mean lengths. The confirm stage replays another seed (``confirm.seeds``) than the search
(``workload.seed``): with lengths drawn independently, vLLM's defaults read 2-4 % lower there.

``streams`` (seconds, no server): for each workload and each stratification block
(``tuner.workload.lengths.BLOCK``; 1 is independent draws), the mean text tokens (the prompt
less the template and system prompt: the turn's input and the conversation's earlier turns),
output tokens and images of the requests a capacity step counts at one load (``LOADS``: chat
at 285 and 470 in flight, its defaults' capacity on the H200 and on the simulator; long_docs
24, image_heavy 64), over ``--stream-seeds`` seeds: their standard deviation and range
between seeds, in % of the mean.

``servers`` (minutes, the simulator): for each of ``--seeds``, in a fresh temporary folder::

    python -m tuner +workload=chat engine=sim objective=capacity space=none \\
        study.n_trials=N objective.capacity.incumbent_probe=false tracking=none \\
        'confirm.picks=[baseline]' confirm.rounds=N workload.seed=S [OVERRIDES...]

i.e. vLLM's defaults on N fresh servers in the search (stream ``S``) and N in the confirm stage
(``confirm.seeds`` [1], at ``confirm.load_factor`` 2 and its near start): every capacity, each
group's mean and spread, and the range of all. Prints the tables and writes
``benchmarks/results/capacity_streams.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from _cli import ROOT, listed, run_tuner, split_overrides

COMMAND = [
    "+workload=chat",
    "engine=sim",
    "objective=capacity",
    "space=none",
    "objective.capacity.incumbent_probe=false",
    "tracking=none",
    "confirm.picks=[baseline]",
]
LOADS = [("chat", 285), ("chat", 470), ("long_docs", 24), ("image_heavy", 64)]
"""Where each stream is counted (workload, requests in flight): chat at its defaults' capacity
on the H200 (285 in flight, docs/gpu-runs/2026-12-02-capacity-probe.md) and on the simulator
(~470, 7.2x its 64); long_docs and image_heavy at 6x and 4x their own concurrency, loads chosen
to count about 100 and 200 requests, not measured capacities."""


def stream_stats(
    workload: str, in_flight: int, blocks: list[int], seeds: int
) -> list[dict[str, Any]]:
    """Per block size: the counted requests' mean text, output tokens and images per seed (the
    stream's mix, ``tuner.workload.request_mix``: its texts are not built), and their spread
    between seeds."""
    import tuner.workload.lengths as lengths
    from tuner.capacity_probe import counted_mix
    from tuner.checks import load_config

    cfg = load_config([f"+workload={workload}", "engine=sim", "paths.output_dir=/tmp/unused"])
    w0 = cfg.workload
    saved = lengths.BLOCK
    out = []
    try:
        for block in blocks:
            lengths.BLOCK = block
            rows = []
            for seed in range(seeds):
                w = replace(w0, seed=seed)
                mix, counted = counted_mix(cfg.objective, w, in_flight / w.arrival.concurrency)
                text, images = mix.text_tokens(), mix.images or [0] * len(mix.turn)
                rows.append(
                    {
                        "seed": seed,
                        "counted": len(counted),
                        "text_tokens": statistics.fmean(text[i] for i in counted),
                        "output_tokens": statistics.fmean(mix.output_tokens[i] for i in counted),
                        "images": statistics.fmean(images[i] for i in counted),
                    }
                )
            out.append({"block": block, "seeds": rows, **_spreads(rows)})
    finally:
        lengths.BLOCK = saved
    return out


def _spreads(rows: list[dict[str, Any]]) -> dict[str, Any]:
    got: dict[str, Any] = {}
    for key in ("text_tokens", "output_tokens", "images"):
        xs = [r[key] for r in rows]
        mean = statistics.fmean(xs)
        if mean <= 0:
            continue
        got[f"{key}_sd_pct"] = 100 * statistics.stdev(xs) / mean if len(xs) > 1 else 0.0
        got[f"{key}_range_pct"] = 100 * (max(xs) - min(xs)) / mean
    return got


def server_run(seed: int, servers: int, overrides: list[str], timeout_s: float) -> dict[str, Any]:
    """The defaults' capacity on ``servers`` fresh servers in the search (stream ``seed``) and as
    many in the confirm stage."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="capacity-streams-") as tmp:
        work = Path(tmp)
        argv = [
            *COMMAND,
            f"study.n_trials={servers}",
            f"confirm.rounds={servers}",
            f"workload.seed={seed}",
            *overrides,
        ]
        p = run_tuner(argv, work, timeout_s)
        if p.returncode != 0:
            raise SystemExit(f"seed {seed}: the tuner exited {p.returncode}:\n{p.stderr[-3000:]}")
        storage = f"sqlite:///{work / 'outputs' / 'state' / 'optuna.db'}"
        (name,) = optuna.get_all_study_names(storage)
        trials = optuna.load_study(study_name=name, storage=storage).trials
        search = [t.user_attrs["metrics"]["capacity_rps"] for t in trials]
        rounds = sorted(work.glob("outputs/runs/*/confirm/trial_*/round_*/capacity.json"))
        confirm = [json.loads(f.read_text())["capacity"]["capacity_rps"] for f in rounds]
    return {
        "seed": seed,
        "search_rps": search,
        "confirm_rps": confirm,
        "search_mean": statistics.fmean(search),
        "confirm_mean": statistics.fmean(confirm),
        "confirm_vs_search_pct": 100 * (statistics.fmean(confirm) / statistics.fmean(search) - 1),
        "wall_s": round(time.monotonic() - t0, 1),
    }


def main(argv: list[str] | None = None) -> int:
    args_in, overrides = split_overrides(argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--parts", default="streams,servers")
    ap.add_argument("--seeds", default="0,1,2", help="the search's workload.seed, one run each")
    ap.add_argument("--servers", type=int, default=3, help="fresh servers per stage and seed")
    ap.add_argument("--blocks", default="1,8,16,32,64", help="stratification blocks (streams)")
    ap.add_argument("--stream-seeds", type=int, default=20, help="seeds per block (streams)")
    ap.add_argument("--timeout-s", type=float, default=900.0, help="per server run")
    ap.add_argument("--out", type=Path, help="default benchmarks/results/capacity_streams.json")
    args = ap.parse_args(args_in)
    parts = listed(ap, args.parts, ("streams", "servers"), "part")
    doc: dict[str, Any] = {"cpus": os.cpu_count(), "overrides": overrides}
    if "streams" in parts:
        blocks = [int(b) for b in args.blocks.split(",")]
        doc["streams"] = [
            {"workload": w, "in_flight": c, "blocks": stream_stats(w, c, blocks, args.stream_seeds)}
            for w, c in LOADS
        ]
        print(f"{'workload':<12} {'in flight':>9} {'block':>6} {'text sd / range':>18} "
              f"{'output sd / range':>18} {'images sd / range':>18}")  # fmt: skip
        for load in doc["streams"]:
            w, c = load["workload"], load["in_flight"]
            for r in load["blocks"]:
                cells = [
                    f"{r[f'{k}_sd_pct']:.2f} / {r[f'{k}_range_pct']:.2f} %"
                    if f"{k}_sd_pct" in r
                    else "-"
                    for k in ("text_tokens", "output_tokens", "images")
                ]
                print(f"{w:<12} {c:>9} {r['block']:>6} " + " ".join(
                    f"{c:>18}" for c in cells))  # fmt: skip
    if "servers" in parts:
        runs = [
            server_run(int(s), args.servers, overrides, args.timeout_s)
            for s in args.seeds.split(",")
        ]
        every = [x for r in runs for x in (*r["search_rps"], *r["confirm_rps"])]
        doc["command"] = ["python", "-m", "tuner", *COMMAND, f"study.n_trials={args.servers}",
                          f"confirm.rounds={args.servers}", "workload.seed=S"]  # fmt: skip
        doc["servers"] = runs
        doc["all_range_pct"] = 100 * (max(every) - min(every)) / statistics.fmean(every)
        print(f"\n{'seed':>4} {'search req/s':<26} {'confirm req/s (seed 1)':<26} "
              f"{'confirm vs search':>17} {'wall s':>7}")  # fmt: skip
        for r in runs:
            s = ", ".join(f"{x:.2f}" for x in r["search_rps"])
            c = ", ".join(f"{x:.2f}" for x in r["confirm_rps"])
            print(f"{r['seed']:>4} {s:<26} {c:<26} {r['confirm_vs_search_pct']:>+16.1f}% "
                  f"{r['wall_s']:>7.0f}")  # fmt: skip
        print(f"all {len(every)} capacities within {doc['all_range_pct']:.1f} % (max - min) / mean")
    out = args.out or ROOT / "benchmarks" / "results" / "capacity_streams.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
