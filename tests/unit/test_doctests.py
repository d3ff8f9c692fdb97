"""The examples in the tuner's docstrings (``>>>``) run and hold: they document behaviour."""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import pkgutil
from pathlib import Path

import pytest

import tuner


def _with_examples() -> list[str]:
    names = []
    for m in pkgutil.walk_packages(tuner.__path__, "tuner."):
        spec = importlib.util.find_spec(m.name)
        if spec and spec.origin and ">>> " in Path(spec.origin).read_text(encoding="utf-8"):
            names.append(m.name)
    return sorted(names)


MODULES = _with_examples()


def test_some_modules_have_examples() -> None:
    assert "tuner.capacity_probe" in MODULES and "tuner.trial" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_the_examples_hold(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0, result
