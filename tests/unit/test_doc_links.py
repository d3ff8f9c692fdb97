"""Every repository file the documentation cites exists.

Checked documents: ``README.md``, ``docs/**/*.md`` and ``benchmarks/results/README.md``. A
citation is a markdown link target, a path in an inline code span (a command in one is split into
its words), or a path in a fenced code block. Such a path counts when it has a ``/`` and its
first part names something in the repository (relative to the root, to the document's folder or,
for a record ``docs/gpu-runs/X.md``, to its folder ``docs/gpu-runs/X/``): ``outputs/…`` or a path
in another project is not one. In the run records (``docs/gpu-runs/*.md``) and in
``benchmarks/results/README.md``, a bare file name in prose (``call1-long.log``) is a citation
too, of a file in the record's folder, except the names of the tuner's per-trial files
(``result.json``: cite a kept one as ``runs.tgz:PATH``), of a model's files and of programs.
``{a,b}`` and ``*`` expand; ``X.tgz:MEMBER`` must
be a member of ``X.tgz``; ``FILE:Name`` (a symbol in a file) checks ``FILE``; in a code block
that unpacks ``X.gz`` first (``gunzip -k X.gz``), ``X`` (``sqlite:///X`` too) cites ``X.gz``.
Words with shell variables or placeholders (``$W``, ``<pick>``, ``…``) are not checked.
"""

from __future__ import annotations

import fnmatch
import functools
import glob
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FILE_EXT = re.compile(
    r"\.(json|jsonl|log|db|tgz|gz|md|html|txt|yaml|yml|py|sh|csv|ipynb|jinja|toml)$"
)
# bare names in the run records that are no file of the record's folder: the tuner's per-trial
# files (in a bundle, if kept: cite one as ``runs.tgz:PATH``), a model's files, programs
GENERIC = re.compile(
    r"^(result|repeats|confirm|pareto|metrics|gpu|requests)\.jsonl?$|^server(-attempt\d+)?\.log$"
    r"|^(config|tokenizer|tokenizer_config)\.json$|\.(py|sh)$"
)
SKIP = ("$", "<", ">", "…", "...", "://", "@", "~")
GUNZIP = re.compile(r"\bgunzip\s+(?:-\S+\s+)*(\S+\.gz)\b")


def documents(root: Path = ROOT) -> list[Path]:
    docs = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    docs.append(root / "benchmarks" / "results" / "README.md")
    return [d for d in docs if d.exists()]


def _expand(token: str) -> list[str]:
    """``a{1,2}b`` -> ``a1b``, ``a2b`` (nested and repeated braces too)."""
    m = re.search(r"\{([^{}]*,[^{}]*)\}", token)
    if not m:
        return [token]
    return [
        e for alt in m[1].split(",") for e in _expand(token[: m.start()] + alt + token[m.end() :])
    ]


def _words(span: str) -> list[str]:
    return [w for w in re.split(r"[\s=\"'();|\[\]]+", span) if w]


def citations(text: str) -> list[tuple[str, bool]]:
    """(token, from_prose) for every candidate path in a markdown text; ``from_prose`` is False
    for the words of a fenced code block (commands), where bare names are not citations."""
    out: list[tuple[str, bool]] = []
    fence = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
    for block in fence.finditer(text):
        # a file the block unpacks first (`gunzip -k X.gz`) is cited as the stored X.gz
        unpacked = {g[: -len(".gz")]: g for g in GUNZIP.findall(block[1])}
        out += [(unpacked.get(w.removeprefix("sqlite:///"), w), False) for w in _words(block[1])]
    prose = fence.sub("", text)
    for m in re.finditer(r"\]\(([^)\s]+)\)", prose):
        out.append((m[1].split("#")[0], True))
    for m in re.finditer(r"`([^`\n]+)`", prose):
        words = _words(m[1])
        out += [(w, len(words) == 1) for w in words]
    return out


def _bases(doc: Path, root: Path) -> list[Path]:
    bases = [root, doc.parent]
    if doc.parent.name == "gpu-runs":
        bases.insert(0, doc.parent / doc.stem)
    return bases


def _is_record(doc: Path, root: Path) -> bool:
    rel = doc.relative_to(root).as_posix()
    return rel.startswith("docs/gpu-runs/") or rel == "benchmarks/results/README.md"


@functools.cache
def _members(tgz: Path) -> frozenset[str]:
    with tarfile.open(tgz) as tar:
        return frozenset(m.name.removeprefix("./") for m in tar.getmembers())


def _exists(base: Path, rel: str) -> bool:
    if "*" in rel or "?" in rel:
        return bool(glob.glob(str(base / rel)))
    return (base / rel).exists()


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
    except ValueError:
        return False
    return True


def check(doc: Path, token: str, from_prose: bool, root: Path) -> str | None:
    """None if ``token`` is no citation or names an existing file; else why it is missing."""
    token = token.strip(".,:;").removeprefix("sqlite:///").removeprefix("./")
    if not token or any(s in token for s in SKIP) or token.startswith(("-", "/", "../")):
        return None
    bases = [b for b in _bases(doc, root) if b.is_dir()]
    for tok in _expand(token):
        member = None
        if ".tgz:" in tok:
            tok, member = tok.split(".tgz:", 1)
            tok += ".tgz"
        elif ":" in tok:
            tok = tok.split(":", 1)[0]
        if "/" not in tok.rstrip("/"):
            if not (from_prose and _is_record(doc, root) and FILE_EXT.search(tok)):
                continue
            if GENERIC.search(tok):
                continue
            found = [b for b in bases if _exists(b, tok)]
        else:
            head = tok.split("/", 1)[0]
            candidates = [b for b in bases if (b / head).exists() and _inside(b / head, root)]
            if not candidates:
                continue  # not a repository path (outputs/…, another project's file)
            found = [b for b in candidates if _exists(b, tok)]
        if not found:
            return f"{tok}: no such file"
        if member is not None:
            tgz = found[0] / tok
            if not any(fnmatch.fnmatchcase(n, member) for n in _members(tgz)):
                return f"{tok}:{member}: no such member"
    return None


def missing(root: Path = ROOT) -> list[str]:
    out = []
    for doc in documents(root):
        for token, from_prose in citations(doc.read_text(encoding="utf-8")):
            why = check(doc, token, from_prose, root)
            if why:
                out.append(f"{doc.relative_to(root)}: {why}")
    return sorted(set(out))


def test_every_cited_file_exists() -> None:
    assert missing() == []


def test_results_readme_lists_every_result_file() -> None:
    """benchmarks/results/README.md has a row for each file kept there."""
    folder = ROOT / "benchmarks" / "results"
    text = (folder / "README.md").read_text(encoding="utf-8")
    rows = {m[1] for m in re.finditer(r"^\| `([^`]+)`", text, re.M)}
    names = {
        p.name
        for p in folder.iterdir()
        if p.name != "README.md" and not p.name.endswith("-quick.json")  # --quick runs: ignored
    }
    assert names - rows == set(), "files without a row"
    assert rows - names == set(), "rows without a file"


def _repo(tmp_path: Path) -> Path:
    (tmp_path / "docs" / "gpu-runs" / "run").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results" / "a.json").write_text("{}")
    (tmp_path / "docs" / "gpu-runs" / "run" / "call1.log").write_text("")
    (tmp_path / "docs" / "gpu-runs" / "run" / "s.db.gz").write_bytes(b"")
    tgz = tmp_path / "docs" / "gpu-runs" / "run" / "runs.tgz"
    src = tmp_path / "result.json"
    src.write_text("{}")
    with tarfile.open(tgz, "w:gz") as tar:
        tar.add(src, arcname="runs/trial_0001/result.json")
    src.unlink()
    return tmp_path


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("see `benchmarks/results/a.json`", True),
        ("see `benchmarks/results/b.json`", False),
        ("[x](gpu-runs/run/call1.log)", True),
        ("[x](gpu-runs/run/call2.log)", False),
        ("```bash\npython x.py --out benchmarks/results/a.json\n```", True),
        ("```bash\npython x.py --out benchmarks/results/{a,c}.json\n```", False),
        (
            "```bash\ngunzip -k gpu-runs/run/s.db.gz\nx storage=sqlite:///gpu-runs/run/s.db\n```",
            True,
        ),
        ("```bash\nx storage=sqlite:///gpu-runs/run/s.db\n```", False),
        (
            "```bash\ngunzip -k gpu-runs/run/t.db.gz\nx storage=sqlite:///gpu-runs/run/t.db\n```",
            False,
        ),
        ("`gpu-runs/run/runs.tgz:runs/trial_0001/result.json`", True),
        ("`gpu-runs/run/runs.tgz:runs/trial_0002/result.json`", False),
        ("`gpu-runs/run/call*.log`", True),
        ("`gpu-runs/run/study-*.log`", False),
        ("`outputs/state/optuna.db`, `$W/x.json`, `best-<pick>.yaml`", True),
    ],
)
def test_the_check_itself(tmp_path: Path, text: str, ok: bool) -> None:
    root = _repo(tmp_path)
    (root / "docs" / "x.md").write_text(text)
    assert (missing(root) == []) is ok


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("`call1.log` and `result.json` (in `runs.tgz`)", True),
        ("`call2.log`", False),
        ("`runs.tgz:runs/trial_0001/result.json`, `runs.tgz:runs/*/result.json`", True),
        ("`runs.tgz:runs/trial_0001/repeats.json`", False),
        ("```bash\ntail call9.log\n```", True),  # a bare name in a command is no citation
    ],
)
def test_bare_names_in_a_run_record(tmp_path: Path, text: str, ok: bool) -> None:
    root = _repo(tmp_path)
    (root / "docs" / "gpu-runs" / "run.md").write_text(text)
    assert (missing(root) == []) is ok


def test_the_readme_is_short_and_nothing_points_outside_the_repository() -> None:
    # a newcomer's README (reference lives in docs/), and no citation of files beside the
    # checkout (the workplace's folders beside it are not part of the project)
    assert len((ROOT / "README.md").read_text().splitlines()) <= 120
    outside = re.compile(r"\.\./shared|shared/(device|research|design|seeds)")
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    hits = []
    for name in filter(None, tracked):
        path = ROOT / name.decode()
        if path.is_symlink() or not path.is_file() or path == Path(__file__).resolve():
            continue  # this file: the pattern itself
        if path.suffix not in {".md", ".py", ".yaml", ".sh", ".toml", ".txt", ".ipynb", ".json"}:
            continue
        text = path.read_text(errors="replace")
        hits += [f"{name.decode()}: {m.group(0)}" for m in outside.finditer(text)]
    assert hits == []
