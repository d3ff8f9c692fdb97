"""The launch retry on a taken port, against real vLLM (a GPU machine with vLLM installed).

A loopback socket holds a port; the tuner's ``free_port`` is made to hand out that port for the
first launch (as tests/integration/test_port_clash.py does with the simulator), so the first
``vllm serve`` of the trial finds its HTTP port taken. Expected: the tuner sees the clash in the
server log, launches again on another port, and the trial is measured (COMPLETE, no failure
reason), with the first launch's log kept as ``server-attempt1.log``.

    python scripts/gpu/port_clash.py WORKDIR [tuner overrides...]   (ENGINE=sim: on the simulator)

Prints one line per check and exits 1 if any fails.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import optuna

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import tuner.study as study_mod  # noqa: E402
import tuner.trial as trial_mod  # noqa: E402
from tuner.checks import load_config  # noqa: E402
from tuner.engine.process import free_port  # noqa: E402
from tuner.storage import storage_url  # noqa: E402


def main() -> int:
    work = Path(sys.argv[1]).resolve()
    work.mkdir(parents=True, exist_ok=True)
    given: list[int] = []
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = int(held.getsockname()[1])

        def fake(host: str = "127.0.0.1") -> int:
            port = taken if not given else free_port(host)
            given.append(port)
            return port

        trial_mod.free_port = fake  # type: ignore[assignment]
        cfg = load_config(
            [
                "+workload=chat",
                f"engine={os.environ.get('ENGINE', 'vllm')}",
                "model=qwen-0.5b",
                "study.name=port-clash",
                "study.n_trials=1",
                "workload.num_requests=100",
                "confirm.enabled=false",
                "tracking=none",
                f"paths.output_dir={work}/out",
                f"paths.state_dir={work}/state",
                *sys.argv[2:],
            ]
        )
        study_mod.run(cfg)
    study = optuna.load_study(study_name="port-clash", storage=storage_url(cfg))
    trial = study.trials[-1]
    tdir = Path(trial.user_attrs["trial_dir"])
    first = (
        (tdir / "server-attempt1.log").read_text(errors="replace")
        if (tdir / "server-attempt1.log").exists()
        else ""
    )
    clash_lines = [ln for ln in first.splitlines() if "in use" in ln.lower()]
    checks = {
        f"first launch on the taken port {taken}": bool(given) and given[0] == taken,
        "launched again on another port": len(given) == 2 and given[1] != taken,
        "server-attempt1.log says the address is in use": bool(clash_lines),
        "trial COMPLETE": trial.state == optuna.trial.TrialState.COMPLETE,
        "no failure reason (measured)": trial.user_attrs.get("failure_reason") is None,
        f"the measured launch used port {given[-1] if given else None}": (
            f"--port {given[-1]}" in " ".join(trial.user_attrs.get("argv", []))
        ),
    }
    print(
        f"ports handed out: {given}; trial {trial.number} {trial.state.name}, "
        f"failure_reason {trial.user_attrs.get('failure_reason')}, "
        f"output_throughput {trial.user_attrs.get('metrics', {}).get('output_throughput')}"
    )
    for line in clash_lines[:3]:
        print(f"  attempt 1 log: {line.strip()[:200]}")
    for what, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {what}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
