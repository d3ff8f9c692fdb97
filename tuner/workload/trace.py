"""Request traces (:class:`~tuner.config.TraceConfig`): rows of (arrival time, input tokens,
output tokens) read from CSV or JSONL, for :func:`tuner.workload.build_requests` to replay.

Two layouts are common and both work by naming the columns:

* GuideLLM: ``timestamp,input_length,output_length`` with the timestamp in seconds (the
  defaults);
* the Azure LLM inference trace: ``TIMESTAMP,ContextTokens,GeneratedTokens`` with a datetime
  such as ``2023-11-16 18:15:46.6805900`` (``timestamp: TIMESTAMP``, ``input_tokens:
  ContextTokens``, ``output_tokens: GeneratedTokens``, ``timestamp_format: datetime``).

Every problem with the file is one :class:`~tuner.errors.ConfigError` line naming the file and
the row (data rows count from 1; a CSV's header is not a row) or the missing column.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from tuner.config import TIMESTAMP_FORMATS, TRACE_FORMATS, TraceConfig, TunerConfig
from tuner.errors import ConfigError

__all__ = ["Trace", "check", "load_trace", "trace_format", "validate_trace"]

_SUFFIXES = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl"}


@dataclasses.dataclass(frozen=True)
class Trace:
    """The selected rows of a trace, in file order.

    ``arrival_s``: send time of each row after the first selected row, already multiplied by
    ``time_scale``; ``rows``: each one's row number in the file (from 1).
    """

    arrival_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    rows: np.ndarray

    def __len__(self) -> int:
        return int(self.rows.size)


def check(cfg: TunerConfig) -> None:
    """``workload.trace``: :func:`validate_trace`, and single-turn requests (ConfigError)."""
    w = cfg.workload
    if w.trace is not None:
        validate_trace(w.trace)
        if w.turns != 1:
            raise ConfigError(
                f"workload.turns is {w.turns}; a trace replays single-turn requests (turns: 1)"
            )


def validate_trace(t: TraceConfig) -> None:
    """The trace settings that can be checked without reading the file (one-line errors)."""
    for key, value, allowed in (
        ("format", t.format, TRACE_FORMATS),
        ("timestamp_format", t.timestamp_format, TIMESTAMP_FORMATS),
    ):
        if value not in allowed:
            raise ConfigError(f"workload.trace.{key} is {value!r}; allowed: {', '.join(allowed)}")
    if not Path(t.path).is_file():
        raise ConfigError(f"workload.trace.path {t.path!r} is not a file")
    if t.time_scale <= 0:
        raise ConfigError(f"workload.trace.time_scale is {t.time_scale}; allowed: > 0")
    if t.limit is not None and t.limit < 1:
        raise ConfigError(f"workload.trace.limit is {t.limit}; allowed: >= 1 or null")
    if t.offset_s < 0:
        raise ConfigError(f"workload.trace.offset_s is {t.offset_s}; allowed: >= 0")


def trace_format(t: TraceConfig) -> str:
    """``csv`` or ``jsonl``: ``t.format`` unless ``auto``, else from the file suffix."""
    if t.format in ("csv", "jsonl"):
        return t.format
    if t.format != "auto":
        raise ConfigError(f"workload.trace.format is {t.format!r}; allowed: auto, csv, jsonl")
    fmt = _SUFFIXES.get(Path(t.path).suffix.lower())
    if fmt is None:
        raise ConfigError(
            f"cannot tell the format of {t.path} from its suffix; set workload.trace.format "
            "to csv or jsonl"
        )
    return fmt


_Rows = Iterator[tuple[int, Mapping[str, Any]]]
"""(row number from 1, the row's values by column or key)"""


def _rows_csv(path: Path, shown: str, needed: list[str]) -> _Rows:
    with path.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        header: list[str] | None = None
        row = 0
        for fields in reader:
            if not any(v.strip() for v in fields):
                continue  # blank lines
            if header is None:
                header = [h.strip() for h in fields]
                for name in needed:
                    if name not in header:
                        raise ConfigError(
                            f"{shown} has no column {name!r}; columns: {', '.join(header)}"
                        )
                continue
            row += 1
            yield row, dict(zip(header, fields, strict=False))
    if header is None:
        raise ConfigError(f"{shown} is empty")


def _rows_jsonl(path: Path, shown: str, needed: list[str]) -> _Rows:
    row = 0
    with path.open(encoding="utf-8-sig") as f:
        for line in f:
            if not line.strip():
                continue
            row += 1
            try:
                obj = json.loads(line.strip())
            except ValueError as exc:
                raise ConfigError(f"row {row} of {shown} is not valid JSON: {exc}") from exc
            if not isinstance(obj, dict):
                raise ConfigError(f"row {row} of {shown} is not a JSON object")
            for name in needed:
                if name not in obj:
                    keys = ", ".join(map(str, obj))
                    raise ConfigError(f"row {row} of {shown} has no key {name!r}; keys: {keys}")
            yield row, obj


def _count(value: Any, role: str, column: str, where: str) -> int:
    what = f"{where}: {role} {_show(value)} (column {column})"
    if isinstance(value, bool):
        raise ConfigError(f"{what} is not an integer")
    number: float | int
    if isinstance(value, int | float):
        number = value
    else:
        text = str(value).strip()
        try:
            number = int(text)
        except ValueError:
            try:
                number = float(text)
            except ValueError:
                raise ConfigError(f"{what} is not an integer") from None
    if isinstance(number, float) and not (math.isfinite(number) and number.is_integer()):
        raise ConfigError(f"{what} is not an integer")
    if number < 1:
        raise ConfigError(f"{what} is less than 1")
    return int(number)


def _show(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def _timestamp(value: Any, t: TraceConfig, where: str) -> float:
    what = f"{where}: timestamp {_show(value)} (column {t.timestamp})"
    if t.timestamp_format == "seconds":
        if isinstance(value, bool):
            raise ConfigError(f"{what} is not a number of seconds")
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{what} is not a number of seconds") from None
        if not math.isfinite(seconds):
            raise ConfigError(f"{what} is not a number of seconds")
        return seconds
    if t.timestamp_format != "datetime":
        raise ConfigError(
            f"workload.trace.timestamp_format is {t.timestamp_format!r}; allowed: seconds, datetime"
        )
    try:
        moment = datetime.fromisoformat(str(value).strip())
    except ValueError:
        raise ConfigError(f"{what} is not a datetime like 2023-11-16 18:15:46.6805900") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)  # only differences matter
    return moment.timestamp()


def load_trace(t: TraceConfig) -> Trace:
    """Read ``t.path`` and select rows: those from ``t.offset_s`` seconds after the first row
    on, at most ``t.limit`` of them. Arrival times count from the first selected row, multiplied
    by ``t.time_scale``.

    Raises :class:`ConfigError` (one line naming the file, and the row or column) for a missing
    file or column, a count that is not a positive integer, a timestamp that cannot be parsed or
    is earlier than the row before it, and a file without rows.
    """
    validate_trace(t)
    path = Path(t.path)
    shown = t.path
    needed = [t.timestamp, t.input_tokens, t.output_tokens]
    fmt = trace_format(t)
    rows_of = _rows_csv if fmt == "csv" else _rows_jsonl

    times: list[float] = []
    ins: list[int] = []
    outs: list[int] = []
    numbers: list[int] = []
    first: float | None = None
    previous: tuple[int, float, Any] | None = None
    try:
        for row, record in rows_of(path, shown, needed):
            where = f"row {row} of {shown}"
            if any(record.get(name) is None for name in needed):  # a short CSV row
                missing = next(name for name in needed if record.get(name) is None)
                raise ConfigError(f"{where} has no value for column {missing!r}")
            ts = _timestamp(record[t.timestamp], t, where)
            if previous is not None and ts < previous[1]:
                raise ConfigError(
                    f"{where}: timestamp {_show(record[t.timestamp])} is earlier than row "
                    f"{previous[0]}'s {_show(previous[2])}; a trace must be sorted by time"
                )
            previous = (row, ts, record[t.timestamp])
            n_in = _count(record[t.input_tokens], "input_tokens", t.input_tokens, where)
            n_out = _count(record[t.output_tokens], "output_tokens", t.output_tokens, where)
            if first is None:
                first = ts
            if ts - first < t.offset_s:
                continue
            if t.limit is not None and len(numbers) >= t.limit:
                break
            times.append(ts)
            ins.append(n_in)
            outs.append(n_out)
            numbers.append(row)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ConfigError(f"cannot read {shown}: {exc}") from exc
    if first is None:
        raise ConfigError(f"{shown} has no rows")
    if not numbers:
        raise ConfigError(
            f"{shown} has no rows at or after workload.trace.offset_s={t.offset_s} "
            f"(the trace spans {previous[1] - first if previous else 0.0:.3f} s)"
        )
    stamps = np.asarray(times, dtype=np.float64)
    return Trace(
        arrival_s=(stamps - stamps[0]) * float(t.time_scale),
        input_tokens=np.asarray(ins, dtype=np.int64),
        output_tokens=np.asarray(outs, dtype=np.int64),
        rows=np.asarray(numbers, dtype=np.int64),
    )
