"""A tuner started with SIGINT ignored (a script's ``&``, ``nohup``, ``trap '' INT``) still stops on
Ctrl-C, with its usual exit code 130: it installs its SIGINT handler itself."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.integration
# the tuner's own entry point, with the study replaced by a wait, under an ignored SIGINT
WRAPPER = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
import tuner.__main__ as cli
def wait():
    print("running", flush=True)
    time.sleep(60)
cli._app = wait
sys.argv = ["tuner", "+workload=chat"]
cli.main()
"""


def test_ctrl_c_stops_a_tuner_started_with_sigint_ignored() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", WRAPPER],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "running"
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted; stored trials are kept" in err
