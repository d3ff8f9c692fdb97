"""scripts/gpu/screen_again.py: a stored screen's table again from its recorded steps, on the
2026-12-07 image_heavy record (docs/gpu-runs/2026-12-07-image-heavy-screen-h100.md)."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "docs/gpu-runs/2026-12-07-image-heavy-screen-h100/run.tgz"


def _again(db: Path, runs: Path) -> str:
    argv = [sys.executable, str(ROOT / "scripts/gpu/screen_again.py"), str(db), str(runs)]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def _record(tmp_path: Path) -> Path:
    with tarfile.open(RECORD) as tar:  # optuna.db, scr.log, runs/<run>/trial_NNNN/capacity.json
        tar.extractall(tmp_path, filter="data")
    return tmp_path


def test_the_screen_is_read_again_from_its_steps(tmp_path: Path) -> None:
    rec = _record(tmp_path)
    out = _again(rec / "optuna.db", rec / "runs")
    # the server the old stand-in read at 17.05 req/s, and the verdicts the record gives
    assert "trial 4 kv_fp8: 8.45 req/s [6.85-9.06] (stored 17.0)" in out
    assert "quant_fp8: +0.6 % (95 % CI −24.7 … +34.4 %; 2 and 2 servers)" in out
    assert "kv_fp8: +1.0 % (95 % CI −43.0 … +79.0 %; 2 and 2 servers)" in out


def test_servers_without_steps_count_as_stored(tmp_path: Path) -> None:
    rec = _record(tmp_path)
    out = _again(rec / "optuna.db", tmp_path / "elsewhere")  # no capacity.json there
    assert "trial 4 kv_fp8: 17.0 req/s as stored (no capacity.json)" in out
    assert "kv_fp8: +36.1 %" in out  # the table as the run printed it (screen-as-run.csv)
