"""What a short simulator study stores, as one JSON: each trial's params, argv, stored attribute
keys, constraint names and trial-folder file list. Run it before and after a refactor that must not
change behaviour, and compare (``--compare OLD.json``).

    python scripts/study_shape.py --out before.json
    python scripts/study_shape.py --compare before.json

The study is issue 20's check: ``+workload=chat engine=sim objective=throughput
'study.enqueue=[{max_num_batched_tokens:4096},{block_size:32}]' study.n_trials=3
confirm.enabled=false``, in a fresh folder (until the default space was rebuilt from the lever
screen, issue #30, it enqueued ``max_num_seqs`` and ``gpu_memory_utilization``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ARGS = [
    "+workload=chat",
    "engine=sim",
    # one replay a trial: a capacity search (the default objective) takes as many as its
    # loads need, so its capacity_K folders would vary from run to run
    "objective=throughput",
    "study.enqueue=[{max_num_batched_tokens:4096},{block_size:32}]",
    "study.n_trials=3",
    "confirm.enabled=false",
]
# Values that change from run to run (ports, paths, times) are not compared: only their presence.
VOLATILE_ARGV = ("--port",)


def _argv(argv: list[str]) -> list[str]:
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            out.append("<volatile>")
            skip = False
            continue
        out.append(a.replace(sys.executable, "<python>").replace(str(ROOT), "<root>"))
        skip = a in VOLATILE_ARGV
    return out


def shape(workdir: Path) -> dict[str, Any]:
    """Run the study in ``workdir`` and describe what it stored."""
    import optuna

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    hydra_dir = workdir / "outputs" / "runs" / "shape"
    proc = subprocess.run(
        [sys.executable, "-m", "tuner", *ARGS, f"hydra.run.dir={hydra_dir}"],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        raise SystemExit(f"study failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    storage = f"sqlite:///{workdir / 'outputs' / 'state' / 'optuna.db'}"
    (name,) = optuna.study.get_all_study_names(storage)
    study = optuna.load_study(study_name=name, storage=storage)
    trials = []
    for t in study.trials:
        tdir = Path(t.user_attrs.get("trial_dir", ""))
        files = sorted(str(p.relative_to(tdir)) for p in tdir.rglob("*") if p.is_file())
        trials.append(
            {
                "number": t.number,
                "state": t.state.name,
                "params": t.params,
                "argv": _argv(t.user_attrs.get("argv", [])),
                "user_attr_keys": sorted(t.user_attrs),
                "system_attr_keys": sorted(k for k in t.system_attrs if k != "constraints"),
                "n_constraints": len(t.system_attrs.get("constraints", []) or []),
                "files": files,
            }
        )
    return {"study": name, "args": ARGS, "trials": trials}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="write the shape here")
    ap.add_argument("--compare", type=Path, help="a shape written before; exit 1 on a difference")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        got = shape(Path(tmp))
    if args.out:
        args.out.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    if args.compare:
        want = json.loads(args.compare.read_text())
        if want != got:
            print(json.dumps({"want": want, "got": got}, indent=1, sort_keys=True))
            print("DIFFERENT", file=sys.stderr)
            raise SystemExit(1)
        print(f"same: {len(got['trials'])} trials, params, argv, attribute keys and files")
    if not args.out and not args.compare:
        print(json.dumps(got, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
