"""A tracking server that answers when the study starts, then goes away: the study finishes on
time, each failed MLflow call one warning line (tuner.tracking, tuner.stores)."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import optuna
import pytest
from helpers.cli import FAST, storage, tuner

pytestmark = pytest.mark.integration

RUN = {
    "info": {
        "run_id": "0" * 32,
        "run_uuid": "0" * 32,
        "experiment_id": "1",
        "status": "RUNNING",
        "start_time": 0,
        "lifecycle_stage": "active",
        "artifact_uri": "mlflow-artifacts:/1/runs",
    },
    "data": {},
}


class FakeMlflow(ThreadingHTTPServer):
    """The few REST routes the tuner's start needs; the first trial's run (the second
    ``runs/create``) finds it gone: the connection dropped unanswered, the port closed."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.paths: list[str] = []
        self.runs = 0
        self.gone = threading.Event()


class Handler(BaseHTTPRequestHandler):
    server: FakeMlflow

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def answer(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def route(self) -> None:
        path = self.path.split("?")[0].removeprefix("/api/2.0/mlflow/")
        self.server.paths.append(path)
        if path == "runs/create":
            self.server.runs += 1
            if self.server.runs > 1:  # the first trial's run: the server dies now
                self.server.gone.set()
                self.close_connection = True
                return
            self.answer(200, {"run": RUN})
        elif path == "experiments/search":
            self.answer(200, {"experiments": []})
        elif path == "experiments/get-by-name":
            self.answer(404, {"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "none"})
        elif path == "experiments/create":
            self.answer(200, {"experiment_id": "1"})
        else:
            self.answer(200, {})

    do_GET = do_POST = route


@pytest.fixture
def fake_mlflow() -> Iterator[FakeMlflow]:
    server = FakeMlflow()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def die() -> None:
        server.gone.wait()
        server.shutdown()
        server.server_close()

    threading.Thread(target=die, daemon=True).start()
    yield server
    server.gone.set()
    thread.join(timeout=10)


def test_a_tracking_server_gone_mid_study_is_a_warning_not_a_wait(
    tmp_path: Path, fake_mlflow: FakeMlflow
) -> None:
    port = fake_mlflow.server_address[1]
    t0 = time.monotonic()
    p = tuner(
        tmp_path,
        "+workload=chat",
        "study.n_trials=2",
        "confirm.enabled=false",
        f"tracking.uri=http://127.0.0.1:{port}",
        *FAST,
        timeout=120,
    )
    took = time.monotonic() - t0
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    assert fake_mlflow.paths[:2] == ["experiments/search", "experiments/get-by-name"]
    assert fake_mlflow.gone.is_set()
    assert "Traceback" not in out
    assert "Retrying (" not in out  # urllib3's warnings for MLflow's calls: left out
    warned = [ln for ln in out.splitlines() if "the study goes on" in ln]
    assert any("logging trial 0 failed (" in ln for ln in warned), out[-3000:]
    # a call within a minute of a failure is skipped, unless it had started already
    assert re.search(r"logging trial 1 (failed \(|skipped \(a call failed )", out)
    assert all(f"MLflow http://127.0.0.1:{port}: " in ln for ln in warned)
    study = optuna.load_study(study_name="chat-qwen3-8b-sim", storage=storage(tmp_path))
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * 2
    assert took < 60, f"the study took {took:.0f} s"
