"""How long a capacity step's requests take to build, this tree against another commit.

Usage::

    python benchmarks/request_build.py [--ref REF] [--workloads chat,long_docs] [--repeats 3]
        [--out PATH]

Before each capacity step the tuner builds its requests (``tuner.capacity_probe.step_requests``:
texts cut token-exact from the corpus, prompts counted with the model's tokenizer), and the step
waits for it. A stream is built once per seed and size, then cached (a warm build); the first
build of a seed is cold: the prediction's first step, the first confirm server's.

For each workload (``LOADS``: chat at 470 in flight, its defaults' capacity on the simulator;
long_docs at 24) and each tree (this checkout, and ``--ref``, default ``HEAD~1``, checked out
into a temporary folder with ``git archive``), in a fresh interpreter per repeat: the corpus
and tokenizer loaded first (not timed), then the step's requests built cold, then warm (the
same seed at a load 5 % higher). Prints the median seconds per tree and their ratio, and writes
``benchmarks/results/request_build.json`` (or ``--out``). Both trees run one after the other on
the same machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from _cli import ROOT, listed

LOADS = {"chat": 470, "long_docs": 24}
"""Requests in flight of the step built per workload."""

CHILD = r"""
import json, sys, tempfile, time
from dataclasses import replace
from pathlib import Path
from tuner.checks import load_config
from tuner.capacity_probe import step_requests, step_size
from tuner.workload import at_load, token_corpus

name, in_flight = sys.argv[1], int(sys.argv[2])
tmp = tempfile.mkdtemp()
cfg = load_config([f"+workload={name}", f"paths.output_dir={tmp}/run", f"paths.state_dir={tmp}/s"])
w, files = cfg.workload, Path(cfg.model.files)
token_corpus(files, w.corpus)  # loaded and tokenised: not timed
out = {}
f = in_flight / w.arrival.concurrency
for label, factor in (("cold", f), ("warm", 1.05 * f)):
    step = at_load(w, factor)
    step = replace(step, num_requests=step_size(cfg.objective, step, True))
    t = time.perf_counter()
    specs = step_requests(step, files, True)
    out[label] = time.perf_counter() - t
    out[label + "_requests"] = len(specs)
print(json.dumps(out))
"""


def _tree(ref: str, into: Path) -> Path:
    """``ref``'s files (``git archive``) under ``into``."""
    archive = into / "ref.tar"
    subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", "-o", str(archive), ref], check=True
    )
    with tarfile.open(archive) as tar:
        tar.extractall(into / "tree", filter="data")
    return into / "tree"


def _time(tree: Path, name: str, repeats: int) -> dict[str, Any]:
    runs = []
    for _ in range(repeats):
        p = subprocess.run(
            [sys.executable, "-c", CHILD, name, str(LOADS[name])],
            cwd=tree,
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(tree)},
            check=False,
        )
        if p.returncode != 0:
            sys.exit(f"{tree}: {name}: {p.stderr.strip().splitlines()[-1]}")
        runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
    return {
        "runs": runs,
        "cold_s": statistics.median(r["cold"] for r in runs),
        "warm_s": statistics.median(r["warm"] for r in runs),
        "requests": runs[0]["cold_requests"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", default="HEAD~1", help="the commit to compare with")
    ap.add_argument("--workloads", default=",".join(LOADS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/request_build.json")
    args = ap.parse_args()
    names = listed(ap, args.workloads, tuple(LOADS), "workloads")
    ref = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", args.ref],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        other = _tree(args.ref, Path(tmp))
        for name in names:
            mine, theirs = _time(ROOT, name, args.repeats), _time(other, name, args.repeats)
            rows.append({"workload": name, "in_flight": LOADS[name], "this": mine, ref: theirs})
    head = f"{'workload':<10} {'requests':>8} {'cold s':>16} {'ratio':>6} {'warm s':>14}"
    print(f"{head} (this / {ref})")
    for r in rows:
        a, b = r["this"], r[ref]
        print(
            f"{r['workload']:<10} {a['requests']:>8} {a['cold_s']:>7.2f} / {b['cold_s']:<6.2f} "
            f"{a['cold_s'] / b['cold_s']:>6.2f} {a['warm_s']:>6.3f} / {b['warm_s']:<6.3f}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"ref": ref, "cpus": os.cpu_count(), "rows": rows}, indent=1) + "\n"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
