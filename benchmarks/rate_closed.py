"""A candidate rule, measured and not adopted: a closed loop's bracket closing on its rates though
its failed end was pruned. The search would stop once the held step's rate and the bound on the
pruned step's (``tuner.capacity_answer._stand_in``) lie within ``rel_width``, as it already does
where the failed step ran in full. Replays the GPU's recorded searches (``capacity.json`` steps
in the order they ran, from ``docs/gpu-runs``, packed ones included) cut at the first step where
the rule would have stopped them: the replays saved, and how far the answer moves from the one
the whole search gave. Cutting a search short is exactly what the rule would do to it, so the
replay needs no model. On 2026-12-07 (89 searches): 18 % of the replays saved; the answers of
the 34 cut searches moved by 1.7 % on average and up to 5.5 %, upward in 23 and downward in 6
(the bound pulls the crossing's rate up until later steps bring it down), so the tuner keeps
narrowing on the load.

Usage::

    python benchmarks/rate_closed.py [--out PATH]

``rel_width`` per record: 0.1 for the long_docs runs (they ran so), else 0.05, the default.
Prints a table and writes ``benchmarks/results/rate_closed.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner.capacity import Step, from_steps  # noqa: E402

RUNS = ROOT / "docs" / "gpu-runs"


def recorded(folder: Path) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """Each recorded search under ``folder``: its name and its steps, as they ran. Packed ones
    (``*.tgz``) are read from the archive; a file without steps (a study's other JSON) is
    skipped."""
    for path in sorted(folder.rglob("*.json")):
        yield from _steps_of(str(path.relative_to(folder)), path.read_bytes())
    for pack in sorted(folder.rglob("*.tgz")):
        with tarfile.open(pack) as tar:
            for member in tar.getmembers():
                if member.isfile() and member.name.endswith("capacity.json"):
                    data = tar.extractfile(member)
                    if data is not None:
                        name = f"{pack.relative_to(folder)}:{member.name}"
                        yield from _steps_of(name, data.read())


def _steps_of(name: str, raw: bytes) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    try:
        data = json.loads(raw)
    except ValueError:
        return
    rows = data.get("steps") if isinstance(data, dict) else data
    if isinstance(rows, list) and rows and isinstance(rows[0], dict) and "factor" in rows[0]:
        yield name, rows


def closes_at(steps: Sequence[Step], rel_width: float) -> int | None:
    """The first step count after which the rule stops the search (the held step's rate and
    the bound on the pruned failed one's within ``rel_width``), if before its end; else None."""
    for k in range(2, len(steps)):
        cap = from_steps(steps[:k])
        failed = [s for s in steps[:k] if not s.held and s.factor > cap.factor]
        if cap.censored or cap.low <= 0 or not failed:
            continue
        if min(failed, key=lambda s: s.factor).pruned is None:
            continue  # a failed step that ran in full: the rule was there already
        if (cap.high - cap.low) / cap.low <= rel_width:
            return k
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/rate_closed.json")
    args = ap.parse_args()
    rows = []
    for name, raw in recorded(RUNS):
        steps = [Step.from_row(r) for r in raw]
        rel_width = 0.1 if "long-docs" in name else 0.05
        whole = from_steps(steps)
        k = closes_at(steps, rel_width)
        cut = from_steps(steps[:k]) if k is not None else whole
        moved = (cut.rps / whole.rps - 1.0) if whole.rps > 0 else 0.0
        rows.append(
            {"search": name, "rel_width": rel_width, "replays": len(steps),
             "replays_cut": k or len(steps), "rps": whole.rps, "rps_cut": cut.rps,
             "moved": moved}
        )  # fmt: skip
    cut_rows = [r for r in rows if r["replays_cut"] < r["replays"]]
    print(f"{'search':<90} {'replays':>7} {'cut':>4} {'req/s':>8} {'cut':>8} {'moved':>7}")
    for r in cut_rows:
        print(
            f"{r['search'][-90:]:<90} {r['replays']:>7} {r['replays_cut']:>4} "
            f"{r['rps']:>8.3f} {r['rps_cut']:>8.3f} {r['moved']:>+7.1%}"
        )
    total = sum(r["replays"] for r in rows)
    saved = total - sum(r["replays_cut"] for r in rows)
    moved = [abs(r["moved"]) for r in cut_rows]
    summary = {
        "searches": len(rows), "replays": total, "cut_searches": len(cut_rows),
        "replays_saved": saved, "saved_share": saved / total if total else 0.0,
        "moved_abs_max": max(moved, default=0.0),
        "moved_abs_mean": sum(moved) / len(moved) if moved else 0.0,
        "moved_up": sum(r["moved"] > 0 for r in cut_rows),
        "moved_down": sum(r["moved"] < 0 for r in cut_rows),
    }  # fmt: skip
    print(
        f"{len(rows)} recorded searches, {total} replays: {len(cut_rows)} stop earlier, "
        f"{saved} replays saved ({summary['saved_share']:.0%}); the answer moves "
        f"{summary['moved_abs_mean']:.1%} on average, at most {summary['moved_abs_max']:.1%}; "
        f"up in {summary['moved_up']}, down in {summary['moved_down']}"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"summary": summary, "rows": rows}, separators=(",", ":")))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
