"""Trace workloads (tuner.workload.trace), image limits, and the trace/ramp config checks."""

from __future__ import annotations

import csv
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tuner.config import ImageConfig, TraceConfig, WorkloadConfig
from tuner.errors import ConfigError
from tuner.workload import build_requests, check_image_sizes, load_tokenizer, load_trace

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "qwen3-8b-dummy"
CORPUS = ROOT / "workloads" / "corpus.txt.gz"
GUIDELLM = ROOT / "workloads" / "traces" / "guidellm_sample.csv"
AZURE = ROOT / "workloads" / "traces" / "azure_sample.csv"
AZURE_KEYS: dict[str, Any] = {
    "timestamp": "TIMESTAMP",
    "input_tokens": "ContextTokens",
    "output_tokens": "GeneratedTokens",
    "timestamp_format": "datetime",
}


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def twl(trace: TraceConfig, **kw: Any) -> WorkloadConfig:
    return WorkloadConfig(name="t", corpus=str(CORPUS), trace=trace, **kw)


# --- the shipped samples, both layouts ---------------------------------------------------------


def test_guidellm_sample_parsed() -> None:
    rows = read_csv(GUIDELLM)
    assert len(rows) == 200
    t = load_trace(TraceConfig(path=str(GUIDELLM)))
    assert len(t) == 200
    assert t.input_tokens.tolist() == [int(r["input_length"]) for r in rows]
    assert t.output_tokens.tolist() == [int(r["output_length"]) for r in rows]
    stamps = np.array([float(r["timestamp"]) for r in rows])
    assert t.arrival_s == pytest.approx(stamps - stamps[0], abs=1e-9)
    assert t.rows.tolist() == list(range(1, 201))


def test_azure_sample_parsed_with_datetimes() -> None:
    rows = read_csv(AZURE)
    assert list(rows[0]) == ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]
    assert rows[0]["TIMESTAMP"] == "2023-11-16 18:15:46.6805900"
    t = load_trace(TraceConfig(path=str(AZURE), **AZURE_KEYS))
    assert len(t) == 200
    assert t.input_tokens.tolist() == [int(r["ContextTokens"]) for r in rows]
    assert t.output_tokens.tolist() == [int(r["GeneratedTokens"]) for r in rows]
    first = datetime.fromisoformat(rows[0]["TIMESTAMP"])
    want = [(datetime.fromisoformat(r["TIMESTAMP"]) - first).total_seconds() for r in rows]
    assert t.arrival_s == pytest.approx(want, abs=1e-6)
    assert t.arrival_s[-1] > 30  # the sample spans about a minute


def test_datetime_fraction_and_time_scale(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "az.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,100,10\n"
        "2023-11-16 18:15:47.1805900,200,20\n"
        "2023-11-16 18:15:49.6805900,300,30\n",
    )
    t = load_trace(TraceConfig(path=path, **AZURE_KEYS))
    assert t.arrival_s == pytest.approx([0.0, 0.5, 3.0], abs=1e-6)
    fast = load_trace(TraceConfig(path=path, time_scale=0.5, **AZURE_KEYS))
    assert fast.arrival_s == pytest.approx([0.0, 0.25, 1.5], abs=1e-6)
    slow = load_trace(TraceConfig(path=path, time_scale=2.0, **AZURE_KEYS))
    assert slow.arrival_s == pytest.approx([0.0, 1.0, 6.0], abs=1e-6)


def test_jsonl_limit_and_offset(tmp_path: Path) -> None:
    lines = [
        json.dumps({"timestamp": 10.0 + i, "input_length": 10 + i, "output_length": 5 + i})
        for i in range(8)
    ]
    path = write(tmp_path, "t.jsonl", "\n".join(lines) + "\n\n")
    t = load_trace(TraceConfig(path=path))
    assert t.arrival_s.tolist() == [float(i) for i in range(8)]
    assert t.input_tokens.tolist() == list(range(10, 18))
    part = load_trace(TraceConfig(path=path, offset_s=2.5, limit=3, time_scale=0.5))
    assert part.rows.tolist() == [4, 5, 6]
    assert part.input_tokens.tolist() == [13, 14, 15]
    assert part.output_tokens.tolist() == [8, 9, 10]
    assert part.arrival_s.tolist() == [0.0, 0.5, 1.0]  # from the first selected row, scaled


def test_trace_requests_token_exact_and_timed() -> None:
    trace = TraceConfig(path=str(GUIDELLM), limit=12, time_scale=0.5)
    specs = build_requests(twl(trace, endpoint="completions", warmup_requests=2), MODEL)
    rows = read_csv(GUIDELLM)[:12]
    tok = load_tokenizer(MODEL)
    assert [s.warmup for s in specs] == [True] * 2 + [False] * 12
    measured = specs[2:]
    stamps = [float(r["timestamp"]) for r in rows]
    for s, r, ts in zip(measured, rows, stamps, strict=True):
        n = len(tok.encode(s.body["prompt"], add_special_tokens=False).ids)
        assert abs(n - int(r["input_length"])) <= int(r["input_length"]) // 100
        assert s.body["max_tokens"] == s.output_tokens == int(r["output_length"])
        assert s.arrival_s == pytest.approx((ts - stamps[0]) * 0.5, abs=1e-9)
    assert [s.body["max_tokens"] for s in specs[:2]] == [int(r["output_length"]) for r in rows[:2]]
    assert all(s.arrival_s is None for s in specs[:2])


def test_trace_requests_deterministic() -> None:
    trace = TraceConfig(path=str(AZURE), limit=6, **AZURE_KEYS)
    a = build_requests(twl(trace, seed=3), MODEL)
    b = build_requests(twl(trace, seed=3), MODEL)
    c = build_requests(twl(trace, seed=4), MODEL)
    dump = lambda specs: [json.dumps(s.body, sort_keys=True) for s in specs]  # noqa: E731
    assert dump(a) == dump(b)
    assert [s.arrival_s for s in a] == [s.arrival_s for s in b]
    assert dump(a) != dump(c)  # other prompt text ...
    assert [s.output_tokens for s in a] == [s.output_tokens for s in c]  # ... same trace


def test_trace_workload_composes(make_cfg: Any) -> None:
    cfg = make_cfg("+workload=trace")
    assert cfg.workload.trace is not None
    assert Path(cfg.workload.trace.path) == GUIDELLM
    cfg = make_cfg(
        "+workload=trace",
        f"workload.trace.path={AZURE}",
        "workload.trace.timestamp=TIMESTAMP",
        "workload.trace.input_tokens=ContextTokens",
        "workload.trace.output_tokens=GeneratedTokens",
        "workload.trace.timestamp_format=datetime",
        "workload.trace.limit=5",
    )
    assert cfg.workload.trace is not None
    assert len(load_trace(cfg.workload.trace)) == 5


# --- bad input: one line naming the file, row or key -------------------------------------------

HEADER = "timestamp,input_length,output_length\n"


@pytest.mark.parametrize(
    ("name", "text", "keys", "message"),
    [
        (
            "x.csv",
            HEADER + "".join(f"{i},10,10\n" for i in range(16)) + "16,abc,10\n",
            {},
            "row 17 of {path}: input_tokens 'abc' (column input_length) is not an integer",
        ),
        (
            "x.csv",
            HEADER + "0,10,10\n1,10,2.5\n",
            {},
            "row 2 of {path}: output_tokens '2.5' (column output_length) is not an integer",
        ),
        (
            "x.csv",
            HEADER + "0,10,10\n1,0,10\n",
            {},
            "row 2 of {path}: input_tokens '0' (column input_length) is less than 1",
        ),
        (
            "x.csv",
            HEADER + "0,10,10\n1,10\n",
            {},
            "row 2 of {path} has no value for column 'output_length'",
        ),
        (
            "x.csv",
            HEADER + "0,10,10\n",
            AZURE_KEYS,
            "{path} has no column 'TIMESTAMP'; columns: timestamp, input_length, output_length",
        ),
        (
            "x.csv",
            "TIMESTAMP,Context,GeneratedTokens\n2023-11-16 18:15:46,1,1\n",
            AZURE_KEYS,
            "{path} has no column 'ContextTokens'; columns: TIMESTAMP, Context, GeneratedTokens",
        ),
        (
            "x.csv",
            HEADER + "0,10,10\n2.5,10,10\n1.5,10,10\n",
            {},
            "row 3 of {path}: timestamp '1.5' is earlier than row 2's '2.5'; "
            "a trace must be sorted by time",
        ),
        (
            "x.csv",
            HEADER + "0,10,10\nsoon,10,10\n",
            {},
            "row 2 of {path}: timestamp 'soon' (column timestamp) is not a number of seconds",
        ),
        (
            "x.csv",
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,1,1\n16/11/2023,1,1\n",
            AZURE_KEYS,
            "row 2 of {path}: timestamp '16/11/2023' (column TIMESTAMP) is not a datetime "
            "like 2023-11-16 18:15:46.6805900",
        ),
        ("x.csv", "", {}, "{path} is empty"),
        ("x.csv", HEADER, {}, "{path} has no rows"),
        ("x.jsonl", "", {}, "{path} has no rows"),
        (
            "x.jsonl",
            '{"timestamp": 0, "input_length": 3, "output_length": 4}\n{"timestamp": 1}\n',
            {},
            "row 2 of {path} has no key 'input_length'; keys: timestamp",
        ),
        (
            "x.jsonl",
            '{"timestamp": 0, "input_length": 3, "output_length": 4}\n{"timestamp": 1,\n',
            {},
            "row 2 of {path} is not valid JSON: "
            "Expecting property name enclosed in double quotes: line 1 column 17 (char 16)",
        ),
        (
            "x.jsonl",
            '{"timestamp": 0, "input_length": true, "output_length": 4}\n',
            {},
            "row 1 of {path}: input_tokens True (column input_length) is not an integer",
        ),
        (
            "x.txt",
            HEADER,
            {},
            "cannot tell the format of {path} from its suffix; set workload.trace.format to "
            "csv or jsonl",
        ),
    ],
)
def test_bad_trace_is_one_line(
    tmp_path: Path, name: str, text: str, keys: dict[str, Any], message: str
) -> None:
    path = write(tmp_path, name, text)
    with pytest.raises(ConfigError) as info:
        load_trace(TraceConfig(path=path, **keys))
    assert str(info.value) == message.format(path=path)
    assert "\n" not in str(info.value)


def test_offset_past_the_end(tmp_path: Path) -> None:
    path = write(tmp_path, "x.csv", HEADER + "0,10,10\n2,10,10\n")
    with pytest.raises(ConfigError) as info:
        load_trace(TraceConfig(path=path, offset_s=5))
    assert str(info.value) == (
        f"{path} has no rows at or after workload.trace.offset_s=5 (the trace spans 2.000 s)"
    )


def test_missing_trace_file_and_bad_keys(make_cfg: Any, tmp_path: Path) -> None:
    missing = tmp_path / "nope.csv"
    with pytest.raises(ConfigError) as info:
        make_cfg("+workload=trace", f"workload.trace.path={missing}")
    assert str(info.value) == f"workload.trace.path '{missing}' is not a file"
    with pytest.raises(ConfigError, match=r"^workload.trace.time_scale is 0.0; allowed: > 0$"):
        make_cfg("+workload=trace", "workload.trace.time_scale=0")
    with pytest.raises(ConfigError, match=r"^workload.trace.timestamp_format is 'unix'; allowed"):
        make_cfg("+workload=trace", "workload.trace.timestamp_format=unix")
    with pytest.raises(ConfigError, match=r"^workload.turns is 2; a trace replays single-turn"):
        make_cfg("+workload=trace", "workload.turns=2")


# --- image buckets against the model's limit ---------------------------------------------------


def model_dir(tmp_path: Path, preprocessor: dict[str, Any] | None) -> Path:
    d = tmp_path / "vl-model"
    d.mkdir()
    (d / "config.json").write_text("{}")
    if preprocessor is not None:
        (d / "preprocessor_config.json").write_text(json.dumps(preprocessor))
    return d


def test_image_bucket_over_max_pixels(tmp_path: Path) -> None:
    d = model_dir(tmp_path, {"max_pixels": 1003520, "min_pixels": 3136})
    im = ImageConfig(sizes=[[512, 512], [1280, 720], [1024, 1024]])
    with pytest.raises(ConfigError) as info:
        check_image_sizes(im, d)
    assert str(info.value) == (
        "workload.images.sizes[2] is 1024x1024 (1048576 pixels; the model accepts at most "
        f"1003520, from max_pixels in {d / 'preprocessor_config.json'})"
    )
    check_image_sizes(ImageConfig(sizes=[[512, 512], [1280, 720]]), d)


def test_image_bucket_over_longest_edge(tmp_path: Path) -> None:
    d = model_dir(tmp_path, {"size": {"longest_edge": 1456}})
    with pytest.raises(ConfigError) as info:
        check_image_sizes(ImageConfig(sizes=[[1456, 1000], [600, 2000]]), d)
    assert str(info.value) == (
        "workload.images.sizes[1] is 600x2000 (longest edge 2000; the model accepts at most "
        f"1456, from size.longest_edge in {d / 'preprocessor_config.json'})"
    )


def test_qwen_style_longest_edge_is_a_pixel_count(tmp_path: Path) -> None:
    d = model_dir(tmp_path, {"size": {"longest_edge": 12845056, "shortest_edge": 3136}})
    check_image_sizes(ImageConfig(sizes=[[3000, 4000]]), d)  # 12 M pixels: fits
    with pytest.raises(ConfigError, match=r"^workload.images.sizes\[0\] is 4000x4000 "):
        check_image_sizes(ImageConfig(sizes=[[4000, 4000]]), d)


def test_image_default_limit_without_preprocessor(tmp_path: Path) -> None:
    d = model_dir(tmp_path, None)
    check_image_sizes(ImageConfig(sizes=[[16384, 16384]]), d)
    with pytest.raises(ConfigError) as info:
        check_image_sizes(ImageConfig(sizes=[[640, 480], [16385, 16384]]), d)
    assert str(info.value) == (
        "workload.images.sizes[1] is 16385x16384 (268451840 pixels; the model accepts at most "
        "268435456, from workload.images.max_pixels)"
    )
    with pytest.raises(ConfigError, match=r"^workload.images.sizes\[0\] is 640x480 "):
        check_image_sizes(ImageConfig(sizes=[[640, 480]], max_pixels=640 * 479), d)


def test_image_limit_checked_at_config_time(make_cfg: Any) -> None:
    make_cfg("+workload=image_heavy")  # the shipped buckets fit the default limit
    with pytest.raises(ConfigError) as info:
        make_cfg("+workload=image_heavy", "workload.images.max_pixels=800000")
    assert str(info.value) == (
        "workload.images.sizes[3] is 1280x720 (921600 pixels; the model accepts at most "
        "800000, from workload.images.max_pixels)"
    )
