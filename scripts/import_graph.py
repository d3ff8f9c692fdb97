"""The import graph of ``tuner/``, read from the source: its circles and its private imports.

    python scripts/import_graph.py [ROOT]

Every ``tuner/**/*.py`` is parsed (nothing is imported) and every import statement counts, wherever
it stands: at module level, inside a function, or under ``if TYPE_CHECKING:`` (a circle that only
type checkers follow is still a circle between the modules; move the shared type instead). An import
resolves to the module it names: ``import tuner.a.b as c`` and ``from tuner.a import b`` (when
``tuner/a/b.py`` or ``tuner/a/b/__init__.py`` exists) to ``tuner.a.b``, ``from tuner.a import name``
to ``tuner.a``; relative imports are resolved against the importing module's package. Parent
packages that Python runs on the way (``tuner.a`` for ``tuner.a.b``) are not counted: a package's
``__init__`` re-exporting its own modules is not a circle. Imports from outside ``tuner`` are
ignored.

Prints each circle (a strongly connected component of two or more modules, or a module importing
itself) as one shortest cycle through it with the line of each import, then its members; then each
private name (``_name``, not ``__dunder__``) taken from another tuner module, by
``from tuner.x import _y`` or as ``x._y`` of an imported tuner module. Exit status 1 if it found
either. ``tests/unit/test_import_graph.py`` runs the same functions.
"""

from __future__ import annotations

import ast
import sys
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "tuner"


@dataclass(frozen=True)
class Import:
    """One import of ``target`` by ``source`` (modules), at ``path:line``."""

    source: str
    target: str
    path: str
    line: int
    where: str
    """``module``, ``function`` (inside a def, at call time) or ``TYPE_CHECKING``."""

    def describe(self) -> str:
        return f"{self.source} -> {self.target}  ({self.path}:{self.line}, {self.where})"


@dataclass(frozen=True)
class PrivateUse:
    """``name`` (underscore-prefixed) of module ``owner`` used by module ``user``."""

    user: str
    owner: str
    name: str
    path: str
    line: int

    def describe(self) -> str:
        return f"{self.user} uses {self.owner}.{self.name}  ({self.path}:{self.line})"


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under ``root/tuner``."""
    mods: dict[str, Path] = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(node: ast.AST, where: str = "module") -> Iterator[tuple[ast.AST, str]]:
    """Every node below ``node`` with where it runs: at import, in a function, or only for type
    checkers (an ``if TYPE_CHECKING:`` body; its ``else`` runs)."""
    for child in ast.iter_child_nodes(node):
        inner = where
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            inner = "function" if where == "module" else where
        yield child, inner
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            yield child.test, inner
            for stmt in child.body:
                yield stmt, "TYPE_CHECKING"
                yield from _walk(stmt, "TYPE_CHECKING")
            for stmt in child.orelse:
                yield stmt, inner
                yield from _walk(stmt, inner)
        else:
            yield from _walk(child, inner)


class _Reader:
    """The imports and private-name uses of one module."""

    def __init__(self, name: str, path: Path, mods: dict[str, Path], root: Path) -> None:
        self.name = name
        self.path = path
        self.mods = mods
        self.rel = str(path.relative_to(root))
        is_pkg = path.name == "__init__.py"
        self.package = name if is_pkg else name.rpartition(".")[0]
        self.imports: list[Import] = []
        self.private: list[PrivateUse] = []
        self.aliases: dict[str, str] = {}
        """Local names bound to a tuner module (``from tuner import replay``, ``import x as y``)."""

    def _base(self, node: ast.ImportFrom) -> str | None:
        if not node.level:
            return node.module
        parts = self.package.split(".")
        up = node.level - 1
        if up > len(parts):
            return None
        base = ".".join(parts[: len(parts) - up]) if up else self.package
        return f"{base}.{node.module}" if node.module else base

    def _add(self, target: str, line: int, where: str) -> None:
        self.imports.append(Import(self.name, target, self.rel, line, where))

    def _private(self, owner: str, name: str, line: int) -> None:
        if owner != self.name:
            self.private.append(PrivateUse(self.name, owner, name, self.rel, line))

    def _enclosing(self, dotted: str) -> str | None:
        """The longest prefix of ``dotted`` that is a tuner module."""
        parts = dotted.split(".")
        for n in range(len(parts), 0, -1):
            cand = ".".join(parts[:n])
            if cand in self.mods:
                return cand
        return None

    def read(self) -> None:
        tree = ast.parse(self.path.read_text(), filename=str(self.path))
        for node, where in _walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] != PACKAGE:
                        continue
                    target = self._enclosing(alias.name)
                    if target is None:
                        continue
                    self._add(target, node.lineno, where)
                    for part in alias.name.split(".")[1:]:
                        if _is_private(part):
                            self._private(target, part, node.lineno)
                    if alias.asname:
                        self.aliases[alias.asname] = target
            elif isinstance(node, ast.ImportFrom):
                base = self._base(node)
                if base is None or base.split(".")[0] != PACKAGE:
                    continue
                owner = self._enclosing(base)
                if owner is None:
                    continue
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    if sub in self.mods:
                        self._add(sub, node.lineno, where)
                        self.aliases[alias.asname or alias.name] = sub
                    else:
                        self._add(owner, node.lineno, where)
                    if _is_private(alias.name):
                        self._private(sub if sub in self.mods else owner, alias.name, node.lineno)
        for node, _ in _walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in self.aliases
                and _is_private(node.attr)
            ):
                self._private(self.aliases[node.value.id], node.attr, node.lineno)


def read_imports(root: Path = ROOT) -> tuple[list[Import], list[PrivateUse]]:
    """Every import between tuner modules, and every private name used across them."""
    mods = module_files(root)
    imports: list[Import] = []
    private: list[PrivateUse] = []
    for name, path in mods.items():
        reader = _Reader(name, path, mods, root)
        reader.read()
        imports += list(dict.fromkeys(reader.imports))  # one per statement, not per name
        private += reader.private
    return imports, private


def graph(imports: list[Import]) -> dict[str, set[str]]:
    g: dict[str, set[str]] = {}
    for imp in imports:
        g.setdefault(imp.source, set()).add(imp.target)
        g.setdefault(imp.target, set())
    return g


def circles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components that are circles (two or more modules, or one that
    imports itself), each sorted, in sorted order (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(g):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(g[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(g[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1 or v in g[v]:
                        found.append(sorted(comp))
    return sorted(found)


def shortest_cycle(g: dict[str, set[str]], members: list[str]) -> list[str]:
    """A shortest cycle through the first of ``members`` within them: [a, b, ..., a]."""
    start = members[0]
    inside = set(members)
    prev: dict[str, str] = {}
    queue = deque([start])
    while queue:
        v = queue.popleft()
        for w in sorted(g[v] & inside):
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(prev[path[-1]])
                return [*reversed(path), start]
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return [start]


def describe_circle(imports: list[Import], g: dict[str, set[str]], members: list[str]) -> str:
    cycle = shortest_cycle(g, members)
    lines = [f"circle of {len(members)} module(s): {' -> '.join(cycle)}"]
    for a, b in zip(cycle, cycle[1:], strict=False):
        lines += [f"    {i.describe()}" for i in imports if i.source == a and i.target == b]
    lines.append(f"  members: {', '.join(members)}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    root = Path(argv[0]).resolve() if argv else ROOT
    imports, private = read_imports(root)
    g = graph(imports)
    found = circles(g)
    for members in found:
        print(describe_circle(imports, g, members))
    for use in private:
        print(f"private: {use.describe()}")
    print(f"{len(found)} circle(s), {len(private)} private name(s) used across modules")
    return 1 if found or private else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
