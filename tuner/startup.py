"""Where a run's server time went: start-up (to /health ready) versus measurement.

The numbers of issue #22's targets: the median ready time and the start-up share of the seconds
servers held their GPUs, with the median of each start-up phase
(:data:`tuner.engine.startup_log.PHASES`) and the compile cache's hits and misses. Shared by the
tuner's end-of-run summary and ``benchmarks/startup.py``.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from tuner.engine.startup_log import PHASES
from tuner.records import LaunchInfo, TrialResult

__all__ = ["launch_summary", "ready_note", "run_summary", "summary_line"]


def launch_summary(
    launches: Sequence[LaunchInfo], before_ready_s: float, held_s: float
) -> dict[str, float]:
    """``median_ready_s``, ``startup_share`` (``before_ready_s`` ÷ ``held_s``), each phase's
    median (``median_startup_<phase>_s``), ``compile_cache_hits`` and ``_misses``."""
    out: dict[str, float] = {}
    if launches:
        out["median_ready_s"] = statistics.median(x.startup_s for x in launches)
    if held_s > 0:
        out["startup_share"] = before_ready_s / held_s
    facts = [x.startup for x in launches if x.startup is not None]
    for phase in PHASES:
        got = [f.phases[phase] for f in facts if phase in f.phases]
        if got:
            out[f"median_startup_{phase}_s"] = statistics.median(got)
    if facts:
        out["compile_cache_hits"] = float(sum(f.compile_cache == "hit" for f in facts))
        out["compile_cache_misses"] = float(sum(f.compile_cache == "miss" for f in facts))
    return out


def run_summary(results: Sequence[TrialResult]) -> dict[str, float]:
    """:func:`launch_summary` of a run's trials: a launch that never got ready held its GPUs
    before ready for all its server seconds."""
    launches = [r.launch for r in results if r.launch is not None]
    before = sum(r.launch.startup_s if r.launch else r.server_s for r in results)
    return launch_summary(launches, before, sum(r.server_s for r in results))


def summary_line(s: dict[str, float], simulated: bool = False) -> str:
    """One line for the console: ready time, share, phases, cache; ``simulated``: the
    simulator's servers, whose start-up and compile cache are modelled, not run."""
    head = "Start-up (simulated)" if simulated else "Start-up"
    if "median_ready_s" not in s:
        return f"{head}: no server became ready."
    phases = ", ".join(
        f"{p} {s[f'median_startup_{p}_s']:.1f}" for p in PHASES if f"median_startup_{p}_s" in s
    )
    share = f"{s['startup_share']:.0%}" if "startup_share" in s else "-"
    cache = ""
    if "compile_cache_hits" in s:
        cache = (
            f"; compile cache {s['compile_cache_hits']:.0f} hit(s), "
            f"{s['compile_cache_misses']:.0f} miss(es)"
        )
    return (
        f"{head}: median ready {s['median_ready_s']:.1f} s, {share} of server-held seconds "
        f"before ready; median phases (s): {phases or '-'}{cache}."
    )


def ready_note(launch: LaunchInfo, simulated: bool = False) -> str:
    """One launch for its trial's first line: ``ready in 98.2 s (compile cache miss), `` and,
    when ``engine.preload`` forked it, that it was; ``simulated``: the simulator's cache,
    modelled (no kernel is compiled)."""
    state = launch.startup.compile_cache if launch.startup else None
    sim = "simulated " if simulated else ""
    cache = f" ({sim}compile cache {state})" if state else ""
    forked = ", forked from the preloaded interpreter" if launch.preloaded else ""
    return f"ready in {launch.startup_s:.1f} s{cache}{forked}, "
