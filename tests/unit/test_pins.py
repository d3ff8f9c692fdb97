"""CI installs pinned versions (.ci/run: ``pip install -c constraints.txt``): every dependency
pyproject.toml declares, the dev extra's too, has a version there."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"]) + list(project["optional-dependencies"]["dev"])
    return {norm(re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0]) for r in reqs}


def pinned() -> dict[str, str]:
    out = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            out[norm(name)] = version
    return out


def test_every_declared_dependency_is_pinned() -> None:
    pins = pinned()
    assert not declared() - set(pins), sorted(declared() - set(pins))
    assert all(re.fullmatch(r"[0-9][0-9A-Za-z.+!-]*", v) for v in pins.values()), pins


def test_ci_installs_with_the_constraints() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"pip install [^\n]*-c constraints\.txt[^\n]*-e \"\.\[dev\]\"", ci), ci
