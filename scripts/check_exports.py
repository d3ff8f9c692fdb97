"""Export every launched trial of the given studies as ``vllm serve --config`` YAML and check, with
vLLM's own parser, that each parses to the same values as the command line the trial launched.

    python scripts/check_exports.py --vllm-python /tmp/vllmcpu/bin/python \\
        'sqlite:///outputs/state/optuna.db#chat-qwen3-8b-sim' [...]

``--vllm-python`` is an interpreter with vLLM installed (tests/data/README.md says how to make one
on a machine without a GPU); this script itself runs in the tuner's environment. Prints one line per
difference and a summary; exit 1 if any export differs.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import optuna

from tuner.config import ConfirmConfig
from tuner.export import write_export

HERE = Path(__file__).resolve().parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--vllm-python", required=True, help="python with vLLM installed")
    ap.add_argument("studies", nargs="+", help="STORAGE_URL#STUDY_NAME")
    args = ap.parse_args()
    ok = bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for item in args.studies:
            storage, _, name = item.rpartition("#")
            study = optuna.load_study(study_name=name, storage=storage)
            for t in study.trials:
                serve_args = t.user_attrs.get("serve_args")
                if not serve_args:
                    continue
                yml, _ = write_export(
                    Path(tmp), f"{name}-{t.number}", serve_args, drop=ConfirmConfig().export_drop
                )
                p = subprocess.run(
                    [args.vllm_python, str(HERE / "vllm_flags.py"), "same", str(yml), "--"]
                    + list(serve_args),
                    capture_output=True,
                    text=True,
                    check=False,
                )
                if p.returncode == 0:
                    ok += 1
                else:
                    bad += 1
                    why = f"{p.stdout.strip()} {p.stderr[-500:]}"
                    sys.stdout.write(f"DIFF {name} trial {t.number}: {why}\n")
    summary = f"{ok} exports parse to the launched values with vLLM's parser; {bad} differ"
    sys.stdout.write(summary + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
