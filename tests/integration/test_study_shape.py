"""What a short study stores stays what it was: each trial's params, argv, attribute keys and
trial-folder files against ``tests/data/study-shape.json`` (written by ``scripts/study_shape.py``
before the house moved into its stage modules). A change meant to alter them updates that file
with ``python scripts/study_shape.py --out tests/data/study-shape.json``."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_a_short_study_stores_the_same_shape(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("study_shape", ROOT / "scripts/study_shape.py")
    assert spec is not None and spec.loader is not None
    shape = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shape)
    want = json.loads((ROOT / "tests" / "data" / "study-shape.json").read_text())
    assert shape.shape(tmp_path) == want
