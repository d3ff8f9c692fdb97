"""Do the verdicts' 95 % intervals hold 95 % of the time, for the designs the records use?

Every gain the docs report is one of :mod:`tuner.verdict`'s intervals on a handful of fresh
servers: Welch's t on the log values (:func:`tuner.verdict.gain`, the confirm stage and a
screen's lever with 2 servers or more on one machine), one server against the defaults' spread
(:func:`tuner.verdict.gain_of_one`, a screen cell of 1 + 2), and the block model over machines
(:func:`tuner.verdict.gain_in_blocks`, a screen or confirm stage spread over several GPU
machines). Each rests on assumptions: log capacities normal around each config's mean, and for
the last two one spread for every config. This draws servers from known configs and counts:

- **coverage**: how often the interval holds the true change (95 % asked);
- **false gain**: with no true change, how often the interval lies wholly above 0 and so reads
  ``gain`` (2.5 % asked: one tail);
- **half-width**: the median of ``(high - low) / 2``, in points: what the design can resolve.

Each design is drawn with the spread the GPUs showed, equal on both sides, and with the lever's
servers spread three times as far as the defaults' (as image_heavy's fp8 KV servers were 16 %
apart where chat's defaults repeated within 3.7 %): the case the pooled spread of the last two
intervals does not model. Machines differ by a random offset shared by every config on them
(two H100s read vLLM's defaults 12 % apart). The capacity search's own resolution (a 5 %
bracket) is drawn as a uniform error on each server.

Usage::

    python benchmarks/interval_coverage.py [--reps N] [--seed S] [--out PATH]

Prints a table and writes ``benchmarks/results/interval_coverage.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner.screen import bracket_floor  # noqa: E402
from tuner.verdict import Gain, gain, gain_in_blocks, gain_of_one  # noqa: E402

REL_WIDTH = 0.05
"""The capacity search's bracket (``objective.capacity.rel_width``): each server's capacity
errs by up to this much, uniformly, on top of the server-to-server spread."""
FLOOR = bracket_floor(REL_WIDTH)
"""The screen's floor on the spread (``tuner.screen``): a bracket's uniform error's sd."""


@dataclass(frozen=True)
class Design:
    """Servers per arm on each machine: ``layout`` is ``(lever servers, defaults' servers)`` per
    machine; ``interval`` the verdict's function for it."""

    name: str
    layout: tuple[tuple[int, int], ...]
    interval: str
    where: str
    """Which records use it."""


RULES = ("shipped", "welch_blocks")
"""The tuner's interval for the design, and the candidate :func:`welch_blocks` (for the designs
over several machines)."""

DESIGNS = (
    Design("confirm 3 + 3", ((3, 3),), "gain", "chat fp8 +17.8 %, the tuner's picks"),
    Design("confirm 2 + 2", ((2, 2),), "gain", "image_heavy, the quick start"),
    Design("screen 1 + 2", ((1, 2),), "gain_of_one", "the screen's cells"),
    Design("screen 1 + 5", ((1, 5),), "gain_of_one", "chat TPOT 15 ms, kv_fp8"),
    Design(
        "blocks 4 + 4, 3 machines",
        ((1, 1), (2, 1), (1, 2)),
        "gain_in_blocks",
        "long_docs kv_fp8 +14.2 %",
    ),
    Design("blocks 4 + 7, 2 machines", ((3, 5), (1, 2)), "gain_in_blocks", "chat TPOT 15 ms, fp8"),
)


@dataclass(frozen=True)
class Noise:
    """Standard deviations on the log scale: a server of the defaults, a server of the lever,
    a machine's offset."""

    name: str
    base_sd: float
    lever_sd: float
    machine_sd: float


NOISES = (
    Noise("equal, 2 %", 0.02, 0.02, 0.06),
    Noise("equal, 6 %", 0.06, 0.06, 0.06),
    Noise("lever 3x wider, 2 % / 6 %", 0.02, 0.06, 0.06),
)


def _server(rng: random.Random, mean_log: float, sd: float) -> float:
    """One fresh server's capacity: its config's mean, its own spread, the bracket's error."""
    bracket = math.log1p(rng.uniform(-REL_WIDTH / 2, REL_WIDTH / 2))
    return math.exp(mean_log + rng.gauss(0.0, sd) + bracket)


def draw(
    rng: random.Random, design: Design, noise: Noise, true_change: float
) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """One run of the design: each arm's servers with their machines."""
    lever: list[tuple[str, float]] = []
    base: list[tuple[str, float]] = []
    for i, (k, n) in enumerate(design.layout):
        offset = math.log(100.0) + rng.gauss(0.0, noise.machine_sd)
        m = f"m{i}"
        lever += [
            (m, _server(rng, offset + math.log1p(true_change), noise.lever_sd)) for _ in range(k)
        ]
        base += [(m, _server(rng, offset, noise.base_sd)) for _ in range(n)]
    return lever, base


def welch_blocks(
    lever: Sequence[tuple[str, float]], base: Sequence[tuple[str, float]], floor: float = FLOOR
) -> Gain:
    """A candidate, not the tuner's: the block model's point with each arm's own spread within
    machines (Welch-Satterthwaite degrees of freedom), the pooled spread only where an arm has
    no two servers on one machine."""
    from scipy import stats

    by: dict[str, tuple[list[float], list[float]]] = {}
    for m, v in lever:
        by.setdefault(m, ([], []))[0].append(math.log(v))
    for m, v in base:
        by.setdefault(m, ([], []))[1].append(math.log(v))
    used = {m: (p, b) for m, (p, b) in by.items() if p and b}
    k = sum(len(p) for p, _ in used.values())
    d = sum(sum(x - statistics.fmean(b) for x in p) for p, b in used.values()) / k

    def within(groups: list[list[float]]) -> tuple[float, int]:
        ss = sum(sum((x - statistics.fmean(g)) ** 2 for x in g) for g in groups)
        return ss, sum(len(g) - 1 for g in groups)

    ss_p, df_p = within([p for p, _ in used.values()])
    ss_b, df_b = within([b for _, b in used.values()])
    if df_p + df_b < 1:
        return Gain(math.expm1(d), n_pick=k, n_base=0, why="no spread")
    pooled = max(math.sqrt((ss_p + ss_b) / (df_p + df_b)), floor)
    sp = max(math.sqrt(ss_p / df_p), floor) if df_p else pooled
    sb = max(math.sqrt(ss_b / df_b), floor) if df_b else pooled
    a = sp**2 / k
    c = sb**2 * sum((len(p) / k) ** 2 / len(b) for p, b in used.values())
    # Welch-Satterthwaite where both arms have a spread of their own, else the pooled one's
    df = (a + c) ** 2 / (a**2 / df_p + c**2 / df_b) if df_p and df_b else df_p + df_b
    half = float(stats.t.ppf(0.975, df)) * math.sqrt(a + c)
    return Gain(math.expm1(d), math.expm1(d - half), math.expm1(d + half), k, len(base))


def interval(
    design: Design,
    lever: Sequence[tuple[str, float]],
    base: Sequence[tuple[str, float]],
    rule: str = "shipped",
) -> Gain:
    values, ref = [v for _, v in lever], [v for _, v in base]
    if rule == "welch_blocks":
        return welch_blocks(lever, base)
    if design.interval == "gain":
        return gain(values, ref, higher=True)
    if design.interval == "gain_of_one":
        return gain_of_one(values[0], ref, higher=True, floor=FLOOR)
    return gain_in_blocks(lever, base, higher=True, floor=FLOOR)


@dataclass(frozen=True)
class Row:
    design: str
    noise: str
    rule: str
    where: str
    coverage: float
    false_gain: float
    power: float
    """How often a true change of +10 % reads ``gain`` (the interval wholly above 0)."""
    half_width_pts: float
    no_interval: float
    reps: int


def measure(
    design: Design, noise: Noise, rule: str, reps: int, seed: int, change: float = 0.10
) -> Row:
    """Coverage, power and half-width at a true ``change``; the false-gain rate at no change.
    Every rule sees the same draws (the same ``seed``)."""
    rng = random.Random(seed)
    covered = found = false = none = 0
    halves: list[float] = []
    for _ in range(reps):
        g = interval(design, *draw(rng, design, noise, change), rule=rule)
        g0 = interval(design, *draw(rng, design, noise, 0.0), rule=rule)
        if g.low is None or g.high is None:
            none += 1
            continue
        covered += g.low <= change <= g.high
        found += g.low > 0
        halves.append((g.high - g.low) / 2 * 100)
        false += g0.low is not None and g0.low > 0
    done = max(1, reps - none)
    return Row(
        design.name,
        noise.name,
        rule,
        design.where,
        covered / done,
        false / done,
        found / done,
        statistics.median(halves) if halves else math.nan,
        none / reps,
        reps,
    )


def table(rows: Sequence[Row], out: Callable[[str], None] = print) -> None:
    out(
        f"{'design':<26} {'noise':<26} {'rule':<13} {'coverage':>9} {'false gain':>11} "
        f"{'power':>6} {'± pts':>6}"
    )
    for r in rows:
        out(
            f"{r.design:<26} {r.noise:<26} {r.rule:<13} {r.coverage:>8.1%} {r.false_gain:>10.1%} "
            f"{r.power:>6.0%} {r.half_width_pts:>6.1f}"
        )


RECORDS = {
    # (lever servers, defaults' servers) with their machines, as run, and the bracket asked
    "long_docs kv_fp8, 4 + 4 on 3 machines (docs/gpu-runs/2026-12-06-long-docs-kv-h100-4.md)": (
        [("e739", 1.12), ("1271", 1.154), ("1271", 1.103), ("0ebe", 1.107)],
        [("e739", 1.02), ("1271", 0.966), ("9da9", 0.963), ("0ebe", 0.975), ("0ebe", 0.972)],
        0.10,
    ),
    "chat TPOT 15 ms quant_fp8, 4 + 7 on 2 machines (docs/gpu-runs/2026-12-06-tpot15-h100-2.md)": (
        [("a", 67.08), ("a", 64.10), ("a", 62.94), ("b", 62.82)],
        [("a", v) for v in (49.08, 44.59, 45.01, 46.63, 45.88)] + [("b", 44.25), ("b", 51.49)],
        0.05,
    ),
}
"""The verdicts on record over several machines, for both rules."""


def records(out: Callable[[str], None] = print) -> dict[str, dict[str, list[float | None]]]:
    """Each of :data:`RECORDS` under the tuner's interval and the candidate."""
    got: dict[str, dict[str, list[float | None]]] = {}
    for name, (lever, base, rel_width) in RECORDS.items():
        floor = bracket_floor(rel_width)
        shipped = gain_in_blocks(lever, base, higher=True, floor=floor)
        cand = welch_blocks(lever, base, floor=floor)
        got[name] = {
            r: [g.value, g.low, g.high] for r, g in (("shipped", shipped), ("welch_blocks", cand))
        }
        out(f"{name}: shipped {_pct(shipped)}; welch_blocks {_pct(cand)}")
    return got


def _pct(g: Gain) -> str:
    if g.value is None or g.low is None or g.high is None:
        return "no interval"
    return f"{g.value:+.1%} ({g.low:+.1%} … {g.high:+.1%})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=4000, help="runs drawn per design and noise")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/interval_coverage.json")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    rows = [
        measure(d, n, rule, args.reps, args.seed + 1000 * i + j)
        for i, d in enumerate(DESIGNS)
        for j, n in enumerate(NOISES)
        for rule in RULES
        if rule == "shipped" or d.interval == "gain_in_blocks"
    ]
    table(rows)
    se = math.sqrt(0.95 * 0.05 / args.reps)
    print(
        f"({args.reps} runs each; a coverage's standard error ~{se:.1%}; "
        f"{time.perf_counter() - t0:.0f} s)"
    )
    on_record = records()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "command": "python benchmarks/interval_coverage.py " + " ".join(argv or sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "true_change": 0.10,
        "rel_width": REL_WIDTH,
        "rows": [asdict(r) for r in rows],
        "records": on_record,
    }
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
