"""Extract the simulator's calibration points from the stored real H200 runs into one JSON file
(or, with ``--gpu h100``, the H100 servers' points the same models are checked on).

Every number comes from a stored file (none is typed here); run it again and the JSON is the same::

    python scripts/calibration_points.py [--out benchmarks/calibration/h200-qwen3-8b.json]
    python scripts/calibration_points.py --gpu h100   # -> benchmarks/calibration/h100-qwen3-8b.json

``--gpu h100``: :func:`h100_points`, one point per launched server of the stored H100 screens
and grid of 2026-12-05 ... 12-07 (:data:`H100_DBS`).

The H200 sources (all vLLM 0.24.0, Qwen3-8B dummy weights, one H200):

- ``chat256``: the Optuna study ``chat256-qwen3-8b`` (chat profile at 256 in flight, 1000 requests,
  TPOT SLO 25 ms): every COMPLETE trial without a failure, its ``metrics`` and the KV tokens vLLM
  logged (``chat-a.log``/``chat-b.log``); the confirm stage's re-runs (seeds 1, 2) of two trials.
- ``chat64-interference``: vLLM defaults, chat profile at its own 64 in flight, 600 requests; the
  mean of the ``alone`` rows of ``interference-h200x2.json``.
- ``bench-c8``/``bench-c64``: ``/v1/completions`` 512-token prompts, outputs uniform 64..192
  (``ignore_eos``), closed loop, both clients' runs averaged (``replay_vs_vllm_bench-h200-*.json``).
- ``random256``: the hand-made reference runs of ``benchmarks/calibration/h200-random256.csv``
  (``vllm bench serve`` random 512 in / 256 out, 1000 prompts, 256 concurrent).
- ``long_docs32``: the Optuna study ``long_docs32-qwen3-8b`` (long_docs profile, one 4k-32k-token
  document per request, at 32 in flight, 96 requests; its storage as the sixth session left it,
  trials 0-24, the later ones two at a time on two GPUs): every COMPLETE launched trial without a
  failure, its ``metrics`` and the KV tokens vLLM logged (trial user attrs); the confirm stage's
  runs (seeds 1, 2) of trial 4 from their ``result.json`` in ``runs.tgz`` (the defaults' confirm
  runs never wrote one).
- ``chat256-prescreen``: the sixth session's chat runs at 256 in flight (the chat256 workload),
  vLLM's defaults and the prescreen's two fp8-KV picks, one point per replay (seeds 0-2 for
  trials 0 and 1, seed 0 for trial 2) from ``runs-chat.tgz``; not in any fit.
- ``chat64``: the first 8-trial study (chat profile, 300 requests, 64 in flight; raw logs under
  ``docs/gpu-runs/2026-11-30-h200/``): output tok/s, TTFT p95 and KV tokens per started trial.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STUDIES = Path("docs/gpu-runs/2026-11-30-h200x2-studies")
FIRST = Path("docs/gpu-runs/2026-11-30-h200")
LONG = Path("docs/gpu-runs/2026-11-30-h200x2-long-vl")
PRESCREEN = Path("docs/gpu-runs/2026-11-30-h200x2-prescreen")  # long_docs 0-24, the chat picks
DEFAULT_OUT = Path("benchmarks/calibration/h200-qwen3-8b.json")
H100_OUT = Path("benchmarks/calibration/h100-qwen3-8b.json")
RANDOM256 = Path("benchmarks/calibration/h200-random256.csv")

CHAT256 = [
    "+workload=chat",
    "workload.arrival.concurrency=256",
    "workload.num_requests=1000",
    "workload.slo.tpot_ms=25",
]
LONG_DOCS32 = ["+workload=long_docs", "workload.arrival.concurrency=32", "workload.num_requests=96"]
METRICS = ("output_throughput", "ttft_p50_ms", "tpot_p50_ms", "ttft_p95_ms", "goodput")


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def _value(text: str) -> Any:
    """A logged flag value as the tuner's params hold it."""
    if text in ("True", "False"):
        return text == "True"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def _params(text: str) -> dict[str, Any]:
    """``k=v k=v`` as logged after ``|``; ``(vLLM defaults)`` is no flag."""
    return {k: _value(v) for k, v in re.findall(r"(\w+)=(\S+)", text)}


def _round(m: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in m.items() if v is not None}


def _logged_kv(logs: Iterable[Path]) -> dict[tuple[int, str], int]:
    """(trial, tag) -> KV tokens vLLM logged; tag ``""`` for the search, ``seed_N`` for confirm."""
    out: dict[tuple[int, str], int] = {}
    pat = re.compile(
        r"trial (\d+): (?:ready in [\d.]+ s, )?KV cache ([\d,]+) tokens.*?(?:\[(\w+)\])?$"
    )
    for log in logs:
        for line in log.read_text().splitlines():
            m = pat.search(line)
            if m:
                out[(int(m[1]), m[3] or "")] = int(_num(m[2]))
    return out


def _trial_point(
    t: Any, group: str, source: str, overrides: list[str], kv: int | None
) -> dict[str, Any]:
    """A calibration point from one stored Optuna trial of a tuner study."""
    m = t.user_attrs["metrics"]
    baseline = bool(t.user_attrs.get("baseline"))
    return {
        "id": f"{group}-t{t.number}",
        "group": group,
        "source": source,
        "workload": {"kind": "tuner", "overrides": overrides},
        "params": {} if baseline else dict(t.params),
        "baseline": baseline,
        "co_running_gpus": int(m.get("co_running_gpus", 0)),
        "runs": 1,
        "measured": _round(
            {k: m.get(k) for k in METRICS}
            | {
                "kv_tokens": kv,
                "predicted_kv_tokens": t.user_attrs.get("predicted_kv_tokens"),
                "preemptions": m.get("preemptions"),
            }
        ),
    }


def chat256_points(root: Path) -> list[dict[str, Any]]:
    import optuna

    from tuner.stored_study import ConfirmRecord

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    db = STUDIES / "chat256-optuna.db"
    study = optuna.load_study(study_name="chat256-qwen3-8b", storage=f"sqlite:///{root / db}")
    kv = _logged_kv(root / STUDIES / f"chat-{x}.log" for x in "ab")
    points: list[dict[str, Any]] = []
    for t in study.trials:
        if t.state != optuna.trial.TrialState.COMPLETE or t.user_attrs.get("failure_reason"):
            continue
        source = f"{db} trial {t.number}; KV from chat-a.log/chat-b.log"
        points.append(_trial_point(t, "chat256", source, CHAT256, kv.get((t.number, ""))))
    confirm = ConfirmRecord.from_study(study)
    for res in confirm.results if confirm is not None else ():
        trial = res.trial
        for run in res.runs:
            seed = int(run["seed"])
            points.append(
                {
                    "id": f"chat256-t{trial}-seed{seed}",
                    "group": "chat256-confirm",
                    "source": f"{db} study attr confirm (trial {trial}, seed {seed})",
                    "workload": {"kind": "tuner", "overrides": [*CHAT256, f"workload.seed={seed}"]},
                    "params": {} if trial == 0 else dict(res.params),
                    "baseline": trial == 0,
                    "co_running_gpus": 0,
                    "runs": 1,
                    "measured": _round(
                        {k: run.get(k) for k in METRICS}
                        | {"kv_tokens": kv.get((trial, f"seed_{seed}"))}
                    ),
                }
            )
    return points


def long_docs_points(root: Path) -> list[dict[str, Any]]:
    import tarfile

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    db = PRESCREEN / "long_docs32-optuna.db"
    study = optuna.load_study(study_name="long_docs32-qwen3-8b", storage=f"sqlite:///{root / db}")
    points: list[dict[str, Any]] = []
    for t in study.trials:
        a = t.user_attrs
        if t.state != optuna.trial.TrialState.COMPLETE or a.get("failure_reason"):
            continue
        if not a.get("launched"):
            continue
        source = f"{db} trial {t.number}"
        points.append(_trial_point(t, "long_docs32", source, LONG_DOCS32, a.get("kv_cache_tokens")))
    tgz = LONG / "runs.tgz"
    pat = re.compile(r"^long/outputs/runs/[^/]+/confirm/trial_(\d+)/seed_(\d+)/result\.json$")
    with tarfile.open(root / tgz) as tar:
        runs = [(int(m[1]), int(m[2]), ti) for ti in tar.getmembers() if (m := pat.search(ti.name))]
        for trial, seed, ti in sorted(runs, key=lambda x: x[:2]):
            f = tar.extractfile(ti)
            assert f is not None
            res = json.loads(f.read())
            if res.get("failure_reason"):
                continue
            points.append(
                _result_point(
                    f"long_docs32-t{trial}-seed{seed}",
                    "long_docs32-confirm",
                    f"{tgz}:{ti.name}",
                    [*LONG_DOCS32, f"workload.seed={seed}"],
                    res,
                    res["metrics"],
                )
            )
    return points


def _result_point(
    pid: str,
    group: str,
    source: str,
    overrides: list[str],
    res: Mapping[str, Any],
    run: Mapping[str, Any],
) -> dict[str, Any]:
    """A calibration point from a trial folder's ``result.json`` (``res``) and one replay's
    metrics (``run``: the result's own, or one entry of ``repeats.json``)."""
    return {
        "id": pid,
        "group": group,
        "source": source,
        "workload": {"kind": "tuner", "overrides": overrides},
        "params": {} if res.get("baseline") else dict(res["params"]),
        "baseline": bool(res.get("baseline")),
        "co_running_gpus": int(run.get("co_running_gpus", 0)),
        "runs": 1,
        "measured": _round(
            {k: run.get(k) for k in METRICS}
            | {
                "kv_tokens": res["launch"].get("kv_cache_tokens"),
                "preemptions": run.get("preemptions"),
            }
        ),
    }


def chat256_prescreen_points(root: Path) -> list[dict[str, Any]]:
    """The sixth session's chat runs (the prescreen's fp8 picks beside the defaults): one point per
    replay, from each trial folder's ``repeats.json`` (``study.repeats=3``: seeds 0, 1, 2) or, for
    a single replay, its ``result.json``."""
    import tarfile

    tgz = PRESCREEN / "runs-chat.tgz"
    pat = re.compile(r"^runs/[^/]+/trial_(\d+)/(repeats|result)\.json$")
    found: dict[int, dict[str, Any]] = {}
    with tarfile.open(root / tgz) as tar:
        for ti in tar.getmembers():
            m = pat.search(ti.name)
            if not m:
                continue
            f = tar.extractfile(ti)
            assert f is not None
            found.setdefault(int(m[1]), {})[m[2]] = (ti.name, json.loads(f.read()))
    points: list[dict[str, Any]] = []
    for trial in sorted(found):
        name, res = found[trial]["result"]
        if res.get("failure_reason") or not res.get("launched"):
            continue
        if "repeats" in found[trial]:
            name, runs = found[trial]["repeats"]
            per_seed = [(int(r["repeat"]) - 1, r) for r in runs]
        else:
            per_seed = [(0, res["metrics"])]
        for seed, run in per_seed:
            points.append(
                _result_point(
                    f"chat256ps-t{trial}-seed{seed}",
                    "chat256-prescreen",
                    f"{tgz}:{name}",
                    [*CHAT256, f"workload.seed={seed}"],
                    res,
                    run,
                )
            )
    return points


def interference_point(root: Path) -> dict[str, Any]:
    path = STUDIES / "interference-h200x2.json"
    data = json.loads((root / path).read_text())
    alone = [r for r in data["rows"] if r["run"] == "alone"]
    setup = data["setup"]
    overrides = [o for o in setup["overrides"] if o.startswith(("+workload=", "workload."))]
    return {
        "id": "chat64-defaults-600",
        "group": "chat64-interference",
        "source": f"{path} rows run=alone (mean)",
        "workload": {"kind": "tuner", "overrides": overrides},
        "params": dict(setup["params"]),
        "baseline": bool(setup.get("baseline")),
        "co_running_gpus": 0,
        "runs": len(alone),
        "measured": _round(
            {k: statistics.fmean(r[k] for r in alone) for k in METRICS if k in alone[0]}
        ),
        "run_values": {
            k: [round(r[k], 3) for r in alone] for k in ("output_throughput", "ttft_p50_ms")
        },
    }


def bench_points(root: Path) -> list[dict[str, Any]]:
    points = []
    for c in (8, 64):
        path = STUDIES / f"replay_vs_vllm_bench-h200-c{c}.json"
        data = json.loads((root / path).read_text())
        s = data["setup"]
        runs = [r for r in data["runs"] if r["concurrency"] == c and not r["failed"]]
        keys = ("output_throughput", "ttft_p50_ms", "tpot_p50_ms")
        points.append(
            {
                "id": f"bench-c{c}",
                "group": "bench",
                "source": f"{path} (mean over runs of both clients)",
                "workload": {
                    "kind": "bench",
                    "endpoint": s["endpoint"],
                    "requests": runs[0]["requests"],
                    "concurrency": c,
                    "input_len": s["input_len"],
                    "output_len": s["output_len"],
                    "output_range_ratio": s["output_range_ratio"],
                    "seed": s["seed"],
                    "warmups": s["warmups"],
                    "prefix_cache_reset": all(s.get("prefix_cache_reset_before_run", [])),
                },
                "params": {a.lstrip("-").replace("-", "_"): True for a in s["server_args"]},
                "baseline": not s["server_args"],
                "co_running_gpus": 0,
                "runs": len(runs),
                "measured": _round({k: statistics.fmean(r[k] for r in runs) for k in keys}),
                "run_values": {k: [round(r[k], 3) for r in runs] for k in keys[:2]},
            }
        )
    return points


def random256_points(root: Path) -> list[dict[str, Any]]:
    """The hand-made ``vllm bench serve`` reference runs (random 512/256, 1000 prompts, 256 in
    flight), one CSV row per config; its ``#`` lines say when and how they were measured."""
    import csv

    lines = (root / RANDOM256).read_text().splitlines()
    points = []
    for row in csv.DictReader(line for line in lines if not line.startswith("#")):
        config = row["config"]
        params: dict[str, Any] = {}
        for flag, val in re.findall(r"`--([\w-]+)(?: ([^`]+))?`", config):
            params[flag.replace("-", "_")] = _value(val) if val else True
        slug = "-".join(f"{k}-{v}" for k, v in params.items()).replace("_", "-") or "defaults"
        points.append(
            {
                "id": f"random256-{slug}".lower(),
                "group": "random256",
                "source": f"{RANDOM256}: {config}",
                "workload": {
                    "kind": "random",
                    "requests": int(row["requests"]),
                    "concurrency": int(row["concurrency"]),
                    "input_len": int(row["input_len"]),
                    "output_len": int(row["output_len"]),
                },
                "params": params,
                "baseline": not params,
                "co_running_gpus": 0,
                "runs": 1,
                "measured": _round(
                    {
                        "output_throughput": _num(row["output_throughput"]),
                        "ttft_p50_ms": _num(row["ttft_p50_ms"]),
                        "tpot_p50_ms": _num(row["tpot_p50_ms"]),
                        "kv_tokens": int(row["kv_tokens"]),
                        "preemptions": int(row["preemptions"]) if row["preemptions"] else None,
                    }
                ),
            }
        )
    return points


def first_study_points(root: Path) -> list[dict[str, Any]]:
    pat = re.compile(
        r"\] trial (\d+)(?: \(baseline\))?: output_throughput ([\d,.]+) tok/s, ttft_p95_ms "
        r"([\d,.]+) ms, .*?\(start [\d.]+ s, KV ([\d,]+)\) \| (.*)$"
    )
    points = []
    for log, study in (("study-part1.log", "chat-qwen3-8b"), ("study-part2.log", "chat-qwen3-8b"),
                       ("study-tp2.log", "chat-qwen3-8b-tp2")):  # fmt: skip
        for line in (root / FIRST / log).read_text().splitlines():
            m = pat.search(line)
            if not m:
                continue
            params = _params(m[5])
            points.append(
                {
                    "id": f"chat64-{'tp2-' if 'tp2' in study else ''}t{m[1]}",
                    "group": "chat64",
                    "source": f"{FIRST / log} (study {study}, trial {m[1]})",
                    "workload": {"kind": "tuner", "overrides": ["+workload=chat"]},
                    "params": params,
                    "baseline": not params,
                    "co_running_gpus": 0,
                    "runs": 1,
                    "measured": {
                        "output_throughput": _num(m[2]),
                        "ttft_p95_ms": _num(m[3]),
                        "kv_tokens": int(_num(m[4])),
                    },
                }
            )
    return points


# The H100 runs (2026-12-05 to 12-07, one H100 80GB HBM3 a machine, vLLM 0.24.0, Qwen3-8B dummy
# weights): every stored screen or grid study under an ``*-h100*`` record, with its workload as
# its record gives it (``scripts/gpu/o_screen.sh``'s CONC / REQS / EXTRA)
CHAT_OWN = ["+workload=chat", "workload.arrival.concurrency=256", "workload.num_requests=800"]
CHAT_TPOT15 = [
    "+workload=chat",
    "workload.arrival.concurrency=64",
    "workload.num_requests=400",
    "workload.slo.tpot_ms=15",
]
LONG_DOCS16 = ["+workload=long_docs", "workload.arrival.concurrency=16"]
H100_GROUPS = {  # study name -> (group, workload, the study's tag in a point's id)
    "chat-qwen3-8b-vllm-capacity-screen": ("h100-chat256", CHAT_OWN, "screen"),
    "chat-tpot15-h100-qwen3-8b-vllm-capacity-screen": ("h100-chat64", CHAT_TPOT15, "screen"),
    "chat-tpot15-h100-nocascade-screen": ("h100-chat64", CHAT_TPOT15, "nocascade"),
    "chat-tpot15-levers": ("h100-chat64", CHAT_TPOT15, "grid"),
    "long_docs-qwen3-8b-vllm-capacity-screen": ("h100-long_docs16", LONG_DOCS16, "screen"),
}
H100_DBS = [
    "2026-12-05-levers-chat-h100-2/optuna.db",
    "2026-12-06-levers-h100/optuna.db",
    "2026-12-06-long-docs-kv-h100/first-machine-optuna.db.gz",
    "2026-12-06-long-docs-kv-h100/optuna.db.gz",
    "2026-12-06-long-docs-kv-h100-2/optuna.db.gz",
    "2026-12-06-long-docs-kv-h100-3/optuna.db.gz",
    "2026-12-06-long-docs-kv-h100-4/optuna.db",
    "2026-12-06-tpot15-h100/optuna.db.gz",
    "2026-12-06-tpot15-h100-2/optuna.db",
    "2026-12-06-tpot15-grid-h100/optuna.db",
    "2026-12-06-tpot15-grid-h100/screen-optuna.db.gz",
    "2026-12-07-levers-chat-h100/optuna.db.gz",
    "2026-12-07-long-docs-fp8-h100/optuna.db.gz",
    "2026-12-07-tpot15-h100-3/optuna.db.gz",
    "2026-12-07-tpot15-h100-4/optuna.db.gz",
    "2026-12-07-tpot15-h100-5/optuna.db.gz",
    "2026-12-07-tpot15-h100-6/optuna.db.gz",
]


def h100_points(root: Path) -> list[dict[str, Any]]:
    """One point per H100 server: its first replay (the workload at its own load, which every
    capacity search starts with; the trial's ``metrics``), the KV tokens vLLM logged and the
    server's SLO capacity (``capacity_censored`` where its search ended holding). Only
    trials that carry the ``machine`` attr (a GPU's UUID, set on every H100 run; the H200 trials
    some of these studies continue carry none), each (machine, study, trial) once, from the
    first file that holds it. A screen trial's params are its arm's flag (the study's ``screen``
    attr); a grid trial's, its passed params."""
    import gzip
    import shutil
    import tempfile

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    gpu_runs = Path("docs/gpu-runs")
    points: list[dict[str, Any]] = []
    seen: set[tuple[str, str, int]] = set()
    with tempfile.TemporaryDirectory(prefix="cal-h100-") as tmp:
        for rel in H100_DBS:
            path = root / gpu_runs / rel
            if path.suffix == ".gz":
                plain = Path(tmp) / rel.replace("/", "_").removesuffix(".gz")
                with gzip.open(path) as src, plain.open("wb") as dst:
                    shutil.copyfileobj(src, dst)
                path = plain
            storage = f"sqlite:///{path}"
            for summary in optuna.get_all_study_summaries(storage):
                group, overrides, tag = H100_GROUPS[summary.study_name]
                study = optuna.load_study(study_name=summary.study_name, storage=storage)
                arms = study.user_attrs.get("screen") or {}
                for t in study.trials:
                    a = t.user_attrs
                    key = (str(a.get("machine")), summary.study_name, t.number)
                    done = t.state == optuna.trial.TrialState.COMPLETE and a.get("launched")
                    if not done or a.get("failure_reason") or not a.get("machine") or key in seen:
                        continue
                    seen.add(key)
                    point = _trial_point(t, group, "", overrides, a.get("kv_cache_tokens"))
                    arm = a.get("screen_arm")
                    if point["baseline"]:
                        params: dict[str, Any] = {}
                    elif arm is not None:
                        params = {arms[arm]["param"]: arms[arm]["value"]}
                    else:
                        params = {k: v for k, v in t.params.items() if v is not None}
                    m = a["metrics"]
                    capacity = {"capacity_rps": m.get("capacity_rps")}
                    if m.get("capacity_censored"):  # the search ended holding: at least this
                        capacity["capacity_censored"] = 1.0
                    point["measured"] |= _round(capacity)
                    point |= {
                        "id": f"{group}-{a['machine'].split(':')[0][:12]}-{tag}-t{t.number}",
                        "source": f"{gpu_runs / rel} study {summary.study_name} trial {t.number}"
                        + (f" ({arm})" if arm else ""),
                        "params": params,
                        "machine": a["machine"],
                    }
                    points.append(point)
    return points


def build_h100(root: Path = ROOT) -> dict[str, Any]:
    return {
        "description": (
            "Real vLLM 0.24.0 measurements (Qwen3-8B dummy weights, one H100 80GB HBM3 a "
            "machine): each H100 capacity server's first replay, the workload at its own load; "
            "made by scripts/calibration_points.py --gpu h100, evaluated by "
            "benchmarks/sim_calibration.py --data. Times in ms, throughput in output tok/s."
        ),
        "model": "qwen3-8b",
        "gpu": "h100",
        "engine_version": "0.24.0",
        "points": h100_points(root),
    }


def build(root: Path = ROOT) -> dict[str, Any]:
    points = chat256_points(root) + [interference_point(root)] + bench_points(root)
    points += random256_points(root)
    points += first_study_points(root)
    points += long_docs_points(root)
    points += chat256_prescreen_points(root)
    return {
        "description": (
            "Real vLLM 0.24.0 measurements (Qwen3-8B dummy weights, one H200) the simulator's "
            "SpeedModel is calibrated on; made by scripts/calibration_points.py, evaluated by "
            "benchmarks/sim_calibration.py. Times in ms, throughput in output tok/s."
        ),
        "model": "qwen3-8b",
        "gpu": "h200",
        "engine_version": "0.24.0",
        "points": points,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", choices=("h200", "h100"), default="h200")
    ap.add_argument("--out", type=Path, help=f"default {DEFAULT_OUT}, or {H100_OUT} with h100")
    args = ap.parse_args()
    data = build_h100(ROOT) if args.gpu == "h100" else build(ROOT)
    out = args.out or ROOT / (H100_OUT if args.gpu == "h100" else DEFAULT_OUT)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{len(data['points'])} points -> {out}")


if __name__ == "__main__":
    main()
