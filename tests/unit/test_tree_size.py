"""The checkout stays small: it travels with every GPU call beside a 48 MiB stage chunk (64 MiB
in all), so what the repository tracks must stay at or under 15 MB."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 15_000_000


def test_tracked_files_total_at_most_15_mb() -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    names = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    total = 0
    for name in filter(None, names):
        path = ROOT / name.decode()
        if path.is_symlink() or path.is_file():
            total += path.lstat().st_size  # a link counts as itself, as git stores it
    assert total <= LIMIT, f"tracked files total {total:,} bytes; the limit is {LIMIT:,}"
