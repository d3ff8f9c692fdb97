"""The lever screen's outputs (:mod:`tuner.screen`): the console table (:func:`print_table`),
``screen.json`` (:func:`write_json`), the MLflow metrics of the parent run (:func:`metrics`) and
the follow-up command (:func:`follow_up`). The figure and ``screen.csv`` are
:func:`tuner.plots.write_figures`'; :func:`tuner.publish.publish` calls all of them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tuner.capacity import rps_text
from tuner.quality_guard import describe
from tuner.score import PER_GPU
from tuner.screen import METRIC, LeverRow
from tuner.sim import IMAGES_BLIND_SPOT
from tuner.verdict import CONFIDENCE, pct

__all__ = ["follow_up", "metrics", "print_table", "row_verdict", "simulated_note", "write_json"]


def _interval(r: LeverRow) -> str:
    g = r.change
    if g.low is None or g.high is None:
        return g.why or ""
    return f"{pct(g.low)} … {pct(g.high)} %"


def _next_step(r: LeverRow) -> str:
    """What to do with the lever next (more servers), and for a lever that changes numerics what
    its eval replays found, since capacity says nothing about the outputs; a gain they could
    not measure points to the quality check on real weights."""
    q = r.quality or {}
    out = " → follow up" if r.follow_up else ""
    if q.get("status") == "measured":
        return out + "; " + describe(q)
    if r.numerics and r.word == "gain" and not r.follow_up:
        return " → check quality on real weights (docs/quality.md)"
    return out


def row_verdict(r: LeverRow) -> str:
    """The table's verdict cell: the word, the next step or the quality found, the drafts'
    acceptance (speculative decoding) and the failures' reasons."""
    out = r.word + _next_step(r)
    if r.acceptance:
        out += "; drafts accepted " + ", ".join(f"{a:.0%}" for a in r.acceptance)
    if r.failures:
        out += f" ({', '.join(r.failures)})"
    return out


def print_table(rows: Sequence[LeverRow], console: Console) -> None:
    """One line per lever: flag, capacity change, its interval, servers, verdict word."""
    base = rows[0].base if rows else ()
    shown = ", ".join(rps_text(c) for c in base) or "none measured"
    machines = rows[0].machines if rows else 1
    per_gpu = bool(rows) and rows[0].metric == PER_GPU
    what, unit = ("SLO capacity per GPU", "req/s per GPU") if per_gpu else ("SLO capacity", "req/s")
    table = Table(
        title=f"Lever screen: {what} vs vLLM's defaults ({shown} {unit} on "
        f"{len(base)} server{'s' if len(base) != 1 else ''}"
        + (f", {machines} machines" if machines > 1 else "")
        + ")"
    )
    for col in ("lever", "flag", f"capacity {unit}", "change", f"{CONFIDENCE:.0%} interval"):
        table.add_column(col)
    if per_gpu:
        table.add_column("req/s a server")
    table.add_column("servers", justify="right")
    table.add_column("verdict")
    for r in rows:
        caps = ", ".join(rps_text(c) for c in r.capacities) + (" (≥)" if r.censored else "")
        verdict = row_verdict(r)
        server = [", ".join(rps_text(c) for c in r.server_rps) or "-"] if per_gpu else []
        table.add_row(
            escape(r.lever) + (" *" if r.numerics else ""),
            escape(r.flag),
            caps or "-",
            "-" if r.change.value is None else f"{pct(r.change.value)} %",
            _interval(r),
            *server,
            f"{len(r.capacities)}/{r.change.n_base}",
            verdict,
        )
    console.print(table)
    console.print(
        "* changes numerics (fp8 weights or KV, speculative decoding). servers: the lever's / "
        "the defaults' it is compared with. With one lever server the interval assumes the "
        "defaults' spread between servers (tuner.verdict.gain_of_one); with more, Welch's t on "
        "both (tuner.verdict.gain)."
        + (
            f" The servers ran on {machines} machines: each lever server is compared with the "
            "defaults of its own machine, the spread taken within machines "
            "(tuner.verdict.gain_in_blocks)."
            if machines > 1
            else ""
        )
    )


def simulated_note(images: bool) -> str:
    """What a screen on the simulator is: its model's reading, and where it is known wrong."""
    note = (
        "simulated (engine=sim): the simulator's model of an H200 (docs/sim-calibration.md), "
        "which chooses what to measure; measure on a GPU with engine=vllm."
    )
    if images:
        note += f" With images: {IMAGES_BLIND_SPOT}."
    return note


def write_json(rows: Sequence[LeverRow], out_dir: Path) -> Path:
    """``screen.json``: every row (:meth:`LeverRow.as_dict`)."""
    path = out_dir / "screen.json"
    data = {
        "metric": rows[0].metric if rows else METRIC,
        "confidence": CONFIDENCE,
        "levers": [r.as_dict() for r in rows],
    }
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    return path


def metrics(rows: Sequence[LeverRow]) -> dict[str, float]:
    """``screen_<lever>_change`` (a fraction), ``_ci_low`` / ``_ci_high``, ``_quality`` (the
    worst agreement of its eval replays with the defaults') and ``_acceptance`` (speculative
    decoding's mean draft acceptance) where measured."""
    out: dict[str, float] = {}
    for r in rows:
        g = r.change
        if g.value is None:
            continue
        out[f"screen_{r.lever}_change"] = g.value
        if g.low is not None and g.high is not None:
            out[f"screen_{r.lever}_ci_low"] = g.low
            out[f"screen_{r.lever}_ci_high"] = g.high
        if r.quality and r.quality.get("status") == "measured":
            out[f"screen_{r.lever}_quality"] = float(r.quality["agreement"])
        if r.acceptance:
            out[f"screen_{r.lever}_acceptance"] = sum(r.acceptance) / len(r.acceptance)
    return out


def follow_up(rows: Sequence[LeverRow]) -> list[str]:
    """The levers worth the follow-up (:attr:`~tuner.screen.LeverRow.follow_up`)."""
    return [r.lever for r in rows if r.follow_up]
