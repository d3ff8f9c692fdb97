"""The confirm stage's quality guard: a pick whose flags change numerics must answer an eval set
as well as vLLM's defaults do in the same round, or it is demoted with the reason ``quality``.

Which flags change numerics is written once, :data:`tuner.vllm_rules.NUMERICS` (the KV cache's
dtype, quantization, the model's dtype, speculative decoding); :func:`tuner.space.numerics_params`
finds them among a candidate's searched params. For each confirm candidate that sets one, and for
the ``baseline`` pick, the eval set (:mod:`tuner.quality`) is replayed greedily on every round's
confirm server after its stress replays (:meth:`Guard.hook`, awaited by
:func:`tuner.trial.run_server` before the server stops). :meth:`Guard.judge` compares each
round's replay with the defaults' of the same round (:func:`tuner.quality.compare`), takes the
worst round's agreement on ``confirm.quality.measure`` (:func:`agreement`) and gates it by
``confirm.quality.min_agreement`` (:func:`gate`). What it found goes with the candidate's
:class:`~tuner.records.ConfirmResult` (``quality``, stored in the confirm record) and, in one
line, with the verdict (:func:`note`).

What a guarded candidate's ``quality["status"]`` can be:

- ``measured``: ``agreement`` (the worst round), ``passed``, every round's comparison;
- ``dummy``: the server builds random weights (``model.load_format=dummy``): "quality not
  measurable: dummy weights", no replay;
- ``off``: ``confirm.quality.enabled=false``: said so, no replay;
- ``unmeasured``: weights are real but no round has both replays (a replay or a server failed,
  or the measure has nothing to compare: the defaults answer no item): demoted, the guard never
  passes a pick it could not check.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tuner import stored_trial
from tuner.artifacts import TrialFolder
from tuner.config import TunerConfig
from tuner.engine.argv import api_key
from tuner.errors import ConfigError
from tuner.quality import (
    DEFAULT_EVALSET,
    Completion,
    QualityReport,
    compare,
    load,
    load_evalset,
    replay,
    save,
)
from tuner.records import Candidate, ConfirmResult
from tuner.space import numerics_flags, numerics_params
from tuner.vllm_rules import numerics_changes

__all__ = [
    "DUMMY",
    "Guard",
    "agreement",
    "check",
    "describe",
    "eval_replay",
    "evalset",
    "gate",
    "note",
    "screen_hook",
    "screen_quality",
]

log = logging.getLogger("tuner")

DUMMY = "quality not measurable: dummy weights"
_OFF = "quality not checked (confirm.quality.enabled=false)"
_MEASURES = {
    "answer_rate": "answer rate {:.2f} of vLLM's defaults'",
    "exact_match": "exact match {:.2f} with vLLM's defaults",
}


def check(cfg: TunerConfig) -> None:
    """The guard compares with the defaults' confirm servers: with real weights and a space that
    can change numerics, ``confirm.picks`` must hold ``baseline`` (else ConfigError, one line)."""
    cc = cfg.confirm
    if not (cc.enabled and cc.quality.enabled) or cfg.model.dummy_weights:
        return
    flags = numerics_flags(cfg.space)
    if flags and "baseline" not in cc.picks:
        raise ConfigError(
            f"confirm.quality compares picks that change numerics ({', '.join(flags)}) with "
            "vLLM's defaults in the same round, but confirm.picks has no baseline; add baseline "
            "to confirm.picks, or set confirm.quality.enabled=false"
        )


def agreement(report: QualityReport, measure: str) -> float | None:
    """The candidate's agreement with the defaults on ``measure``: ``exact_match``, or for
    ``answer_rate`` its answer rate over theirs; None when the defaults answer no item (no loss
    can be seen) or the eval set states no answer."""
    if measure == "exact_match":
        return report.exact_match
    cand, base = report.answer_rate_candidate, report.answer_rate_baseline
    if cand is None or base is None or base <= 0:
        return None
    return cand / base


def gate(agreements: Sequence[float | None], bound: float) -> tuple[float | None, bool]:
    """The worst round's agreement and whether it is at least ``bound``; (None, False) when no
    round was measured."""
    have = [a for a in agreements if a is not None]
    if not have:
        return None, False
    worst = min(have)
    return worst, worst >= bound


def describe(q: Mapping[str, Any]) -> str:
    """A candidate's ``quality`` record in words (the export header, the verdict's note)."""
    status = q.get("status")
    if status == "dummy":
        return DUMMY
    if status == "off":
        return _OFF
    if status != "measured":
        return f"quality not measured ({q.get('why') or 'no round had both replays'})"
    shown = _MEASURES[str(q["measure"])].format(float(q["agreement"]))
    rounds = len([r for r in q.get("rounds", ()) if r.get("agreement") is not None])
    if q.get("passed"):
        return f"quality: {shown} (worst of {rounds} round(s), >= {q['min_agreement']:.2f})"
    return f"quality: {shown}, below confirm.quality.min_agreement {q['min_agreement']:.2f}"


def note(results: Sequence[ConfirmResult]) -> str | None:
    """What the guard found over the candidates, for the verdict line; None when no candidate
    changes numerics."""
    guarded = [r for r in results if r.quality]
    if not guarded:
        return None
    statuses = {str((r.quality or {}).get("status")) for r in guarded}
    trials = ", ".join(str(r.trial) for r in guarded)
    if statuses == {"dummy"}:
        return f"{DUMMY} (trial {trials} changes numerics)"
    if statuses == {"off"}:
        return f"{_OFF}: trial {trials} changes numerics"
    return "; ".join(f"trial {r.trial} {describe(r.quality or {})}" for r in guarded)


def evalset(cfg: TunerConfig) -> Path:
    """``confirm.quality.evalset``, else the project's (:data:`tuner.quality.DEFAULT_EVALSET`)."""
    return Path(cfg.confirm.quality.evalset or DEFAULT_EVALSET)


async def eval_replay(cfg: TunerConfig, url: str, who: str) -> list[Completion] | str:
    """The eval set replayed greedily on the server at ``url`` (``confirm.quality.*``), or why it
    failed (logged with ``who``): never the study's end."""
    q = cfg.confirm.quality
    try:
        return await replay(
            url,
            load_evalset(evalset(cfg), q.limit),
            model=cfg.model.served_name,
            max_tokens=q.max_tokens,
            concurrency=q.concurrency,
            api_key=api_key(cfg.engine, cfg.model),
        )
    except (ConfigError, LookupError, TypeError, ValueError) as exc:
        why = str(exc) if isinstance(exc, ConfigError) else f"a bad answer: {exc!r}"
        log.warning("%s's eval replay failed: %s", who, why)
        return why


@dataclass
class Guard:
    """The guard of one confirm stage: which candidates it checks, their eval replays by
    ``(trial, round)`` (a replay that failed: its error), and the verdict on each."""

    cfg: TunerConfig
    candidates: Sequence[Candidate]
    replays: dict[tuple[int, int], list[Completion] | str] = field(default_factory=dict)

    def changes(self, c: Candidate) -> dict[str, Any]:
        """The candidate's params that change numerics (none for vLLM's defaults)."""
        return {} if c.baseline else numerics_params(self.cfg.space, c.params)

    @property
    def guarded(self) -> list[Candidate]:
        return [c for c in self.candidates if self.changes(c)]

    @property
    def baseline(self) -> Candidate | None:
        return next((c for c in self.candidates if c.baseline), None)

    @property
    def measures(self) -> bool:
        """Replays run: the guard is on, the weights real, and a candidate changes numerics."""
        q = self.cfg.confirm.quality
        return q.enabled and not self.cfg.model.dummy_weights and bool(self.guarded)

    def intro(self) -> str | None:
        """The log line before the confirm stage; None when no candidate changes numerics."""
        guarded = self.guarded
        if not guarded:
            return None
        what = ", ".join(
            f"trial {c.trial} ({' '.join(f'{k}={v}' for k, v in self.changes(c).items())})"
            for c in guarded
        )
        if not self.cfg.confirm.quality.enabled:
            return f"confirm: {_OFF}: {what} change(s) numerics"
        if self.cfg.model.dummy_weights:
            return f"confirm: {DUMMY}: {what} change(s) numerics"
        q = self.cfg.confirm.quality
        return (
            f"confirm: quality guard on {what}: the eval set {evalset(self.cfg).name} replayed on "
            f"their servers and on vLLM's defaults' in every round; {q.measure} >= "
            f"{q.min_agreement:g} (confirm.quality.min_agreement)"
        )

    def hook(self, c: Candidate, rnd: int) -> Callable[[str], Awaitable[None]] | None:
        """What :func:`tuner.trial.run_server` awaits with the URL of candidate ``c``'s server in
        round ``rnd``: the eval replay (None when this server needs none)."""
        if not self.measures or not (c.baseline or self.changes(c)):
            return None

        async def after(url: str) -> None:
            self.replays[(c.trial, rnd)] = await eval_replay(
                self.cfg, url, f"confirm: trial {c.trial}"
            )

        return after

    def judge(self, result: ConfirmResult, c: Candidate, rounds: int) -> ConfirmResult:
        """``result`` with the guard's record, demoted (reason ``quality``) below the bound or
        when the guard could not measure on real weights."""
        changes = self.changes(c)
        if not changes:
            return result
        q = self.cfg.confirm.quality
        record: dict[str, Any] = {"changes": [f"{k}={v}" for k, v in changes.items()]}
        if not q.enabled:
            return replace(result, quality={**record, "status": "off"})
        if self.cfg.model.dummy_weights:
            return replace(result, quality={**record, "status": "dummy"})
        record |= {"measure": q.measure, "min_agreement": q.min_agreement}
        rows, why = self._rounds(c, rounds)
        worst, passed = gate([r.get("agreement") for r in rows], q.min_agreement)
        if worst is None:
            record |= {"status": "unmeasured", "why": why, "passed": False, "rounds": rows}
        else:
            record |= {"status": "measured", "agreement": worst, "passed": passed, "rounds": rows}
        if passed:
            return replace(result, quality=record)
        reasons = [x for x in (result.reason, describe(record)) if x]
        return replace(result, quality=record, passed=False, reason="; ".join(reasons))

    def _rounds(self, c: Candidate, rounds: int) -> tuple[list[dict[str, Any]], str | None]:
        """Each round's comparison with the defaults' replay of the same round, and why none
        could be made (for the record)."""
        base = self.baseline
        if base is None:
            return [], "vLLM's defaults are not among the confirm candidates"
        rows: list[dict[str, Any]] = []
        why = None
        items = load_evalset(evalset(self.cfg), self.cfg.confirm.quality.limit)
        for rnd in range(1, rounds + 1):
            mine, ref = self.replays.get((c.trial, rnd)), self.replays.get((base.trial, rnd))
            if isinstance(mine, list) and isinstance(ref, list):
                report = compare(mine, ref, items)
                a = agreement(report, self.cfg.confirm.quality.measure)
                rows.append({"round": rnd, "agreement": a, **report.as_dict()})
                if a is None:
                    why = "the eval set's answers: vLLM's defaults gave none"
            else:
                miss = next((x for x in (mine, ref) if isinstance(x, str)), None)
                why = miss or "no eval replay (a server failed)"
                rows.append({"round": rnd, "agreement": None, "error": why})
        return rows, why


# --- the lever screen (mode=screen) ---------------------------------------------------------------


def screen_hook(
    cfg: TunerConfig, params: Mapping[str, Any], baseline: bool, tdir: Path
) -> Callable[[str], Awaitable[None]] | None:
    """In ``mode=screen`` with real weights and ``confirm.quality.enabled``: the eval replay on
    every defaults' server and on every lever server whose flag changes numerics, saved as the
    trial folder's ``quality.json`` for :func:`screen_quality` (a failed replay saves nothing).
    None for any other server."""
    if cfg.mode != "screen" or not cfg.confirm.quality.enabled or cfg.model.dummy_weights:
        return None
    if not baseline and not numerics_changes(params):
        return None

    async def after(url: str) -> None:
        got = await eval_replay(cfg, url, f"screen: {tdir.name}")
        if not isinstance(got, str):
            save(got, TrialFolder(tdir).quality, baseline=baseline)

    return after


def _saved(t: stored_trial.Stored) -> list[Completion] | None:
    d = stored_trial.trial_dir(t)
    path = TrialFolder(d).quality if d is not None else None
    return load(path) if path is not None and path.is_file() else None


def screen_quality(
    cfg: TunerConfig,
    changes: Sequence[str],
    lever: Sequence[stored_trial.Stored],
    defaults: Sequence[stored_trial.Stored],
) -> dict[str, Any]:
    """A screened lever's quality record, in :meth:`Guard.judge`'s shape (:func:`describe`
    reads it): the eval replay of every lever server against that of every defaults' server
    (:func:`tuner.quality.compare`; each pair a row), the worst pair's agreement on
    ``confirm.quality.measure`` gated by ``confirm.quality.min_agreement``. The replays are read
    from the trial folders, so a report on another machine says ``unmeasured``."""
    q = cfg.confirm.quality
    record: dict[str, Any] = {"changes": list(changes)}
    if not q.enabled:
        return {**record, "status": "off"}
    if cfg.model.dummy_weights:
        return {**record, "status": "dummy"}
    record |= {"measure": q.measure, "min_agreement": q.min_agreement}
    mine = [(t.number, _saved(t)) for t in lever]
    ref = [(t.number, _saved(t)) for t in defaults]
    items = load_evalset(evalset(cfg), q.limit)
    rows = [
        {
            "round": f"trial {a} vs {b}",
            "agreement": agreement(report, q.measure),
            **report.as_dict(),
        }
        for a, ca in mine
        if ca is not None
        for b, cb in ref
        if cb is not None
        for report in (compare(ca, cb, items),)
    ]
    worst, passed = gate([r["agreement"] for r in rows], q.min_agreement)
    if worst is None:
        why = (
            "the eval set's answers: vLLM's defaults gave none"
            if rows
            else "no eval replay of both a lever and a defaults' server in the trial folders here"
        )
        return {**record, "status": "unmeasured", "why": why, "passed": False, "rounds": rows}
    return {**record, "status": "measured", "agreement": worst, "passed": passed, "rounds": rows}
