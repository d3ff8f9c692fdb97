"""``tuner/`` has no import circle and no module takes another's private names.

The graph is read from the source by ``scripts/import_graph.py`` (``python scripts/import_graph.py``
prints the same findings): every import counts, at module level, inside a function or under
``if TYPE_CHECKING:``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ig() -> Any:
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts/import_graph.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["import_graph"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_no_import_circles(ig: Any) -> None:
    imports, _ = ig.read_imports(ROOT)
    g = ig.graph(imports)
    found = ig.circles(g)
    assert not found, "import circles in tuner/:\n" + "\n".join(
        ig.describe_circle(imports, g, members) for members in found
    )


def test_no_private_names_across_modules(ig: Any) -> None:
    _, private = ig.read_imports(ROOT)
    assert not private, "private names used across tuner modules:\n" + "\n".join(
        u.describe() for u in private
    )


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_reader_resolves_every_form(ig: Any, tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "tuner/__init__.py": "",
            "tuner/a.py": "from tuner import b\nimport tuner.pkg.c as c\n",
            "tuner/b.py": "def f():\n    from .pkg import c\n",
            "tuner/pkg/__init__.py": "from .c import thing\n",
            "tuner/pkg/c.py": (
                "from typing import TYPE_CHECKING\n"
                "import os\n"
                "if TYPE_CHECKING:\n"
                "    from ..a import X\n"
                "from tuner.pkg import d\n"
            ),
            "tuner/pkg/d.py": "from tuner.b import name\nimport tuner.pkg\n",
            "tuner/pkg/e.py": "from tuner.pkg import thing\n",
        },
    )
    imports, private = ig.read_imports(root)
    edges = {(i.source, i.target, i.where) for i in imports}
    assert edges == {
        ("tuner.a", "tuner.b", "module"),
        ("tuner.a", "tuner.pkg.c", "module"),
        ("tuner.b", "tuner.pkg.c", "function"),
        ("tuner.pkg", "tuner.pkg.c", "module"),
        ("tuner.pkg.c", "tuner.a", "TYPE_CHECKING"),
        ("tuner.pkg.c", "tuner.pkg.d", "module"),
        ("tuner.pkg.d", "tuner.b", "module"),
        ("tuner.pkg.d", "tuner.pkg", "module"),
        ("tuner.pkg.e", "tuner.pkg", "module"),
    }
    assert not private
    g = ig.graph(imports)
    # a -> pkg.c -> a (TYPE_CHECKING), b -> pkg.c -> pkg.d -> b (in a function) and
    # pkg -> pkg.c -> pkg.d -> pkg (named) all count
    members = ["tuner.a", "tuner.b", "tuner.pkg", "tuner.pkg.c", "tuner.pkg.d"]
    assert ig.circles(g) == [members]
    assert ig.shortest_cycle(g, members) == [
        "tuner.a",
        "tuner.pkg.c",
        "tuner.a",
    ]


def test_reader_finds_private_names(ig: Any, tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "tuner/__init__.py": "__version__ = '1'\n",
            "tuner/a.py": "_x = 1\n_y = 2\nprint(_x)\n",
            "tuner/b.py": (
                "from tuner.a import _x\n"
                "from tuner import a, __version__\n"
                "def f():\n    return a._y\n"
            ),
        },
    )
    _, private = ig.read_imports(root)
    assert [(u.user, u.owner, u.name, u.line) for u in private] == [
        ("tuner.b", "tuner.a", "_x", 1),
        ("tuner.b", "tuner.a", "_y", 4),
    ]
    imports, _ = ig.read_imports(root)
    assert ig.circles(ig.graph(imports)) == []
