"""How much two parallel trials bias each other, and what CPU pinning takes back.

Usage::

    python benchmarks/interference.py [--reps N] [--params JSON] [--out PATH] [--log-dir DIR]
        [-- TUNER OVERRIDES...]

On the 2-GPU H200 machine::

    python benchmarks/interference.py --reps 2 --out benchmarks/results/interference-h200x2.json \\
        -- engine=vllm +workload=chat 'engine.gpus=[0,1]'

Without overrides it runs on the simulator (``engine=sim``, ``+workload=chat
workload.num_requests=60 workload.arrival.concurrency=16 engine.gpus=[0,1]``, and
``engine.cpu_reserve=0`` on a machine of fewer than 6 cores): the numbers then measure this
machine's CPU contention between two simulated servers and one replay client, not a GPU's.

Design: server reuse. The tuner config is composed as ``python -m tuner`` composes it (Hydra's
compose API, the overrides after ``--``; ``+workload=chat`` if none is named). TWO servers are
launched once, concurrently, with the same argv — vLLM's defaults (the baseline trial's argv,
``trial_argv(..., baseline=True)``), or the searched params of ``--params '{"max_num_seqs":
256}'`` — one on each of the first two GPUs of ``engine.gpus`` (``CUDA_VISIBLE_DEVICES`` of its
GPU, through ``build_env`` as the tuner's ``_run_server`` does), each on a free port, each in a
process group of its own (:class:`tuner.engine.process.Server`), stopped as a group at the end,
on an error and on Ctrl-C/SIGTERM. ``VLLM_SERVER_DEV_MODE=1`` (set by the engine configs, and
put into the servers' environment here if an override removed it) makes vLLM mount
``/reset_prefix_cache``.

Then, per rep, for each mode — ``unpinned`` and ``pinned``, in ABBA order over the reps (rep 0
unpinned first, rep 1 pinned first, ...) so drift hits both — the mode's CPU affinity is
applied and three replays run: server A alone, server B alone, and A and B at the same time (both
replays gathered in one asyncio event loop in this process, as the tuner runs
``study.n_workers=2``). Every replay sends the same request list (``build_requests`` of the
workload, warm-ups included) through the tuner's client (:func:`tuner.replay.replay`) and is
scored by :func:`tuner.score.summarize`, so output tok/s, TTFT p50 and goodput are the tuner's
own numbers. Before each replay the server's prefix and multimodal caches are reset as the tuner
resets them between replays on one server (``tuner.measure.reset_caches``; ``caches_reset`` in
each row says whether the server allowed it).

Pinning. ``pinned``: :func:`tuner.engine.pool.cpu_plan` over this process's CPU affinity gives
each GPU's server its own cores (``engine.cpu_reserve`` cores kept first); before every replay
every thread (``/proc/<pid>/task/<tid>``) of every process of the server (its process group, and
descendants of its pid) is set to them with ``sched_setaffinity``, and this process's threads to
the reserved cores (left on all cores when the reserve is 0). ``unpinned``: every thread of both
servers and of this process is set back to all cores of the original affinity. After each replay
the affinity of every server thread is read back (``tasks_on_plan`` of ``tasks_checked``,
``cpus_read_back`` of the server's main pid). The tuner's own ``engine.cpu_pinning=true`` pins a
server at launch, before it forks, so every child inherits the cores; pinning at runtime, as
here, is equivalent except for memory already placed (NUMA first touch: pages the server touched
before it was pinned stay on the node where they were allocated) and for thread pools a library
sized from the affinity it saw at start-up (their threads are pinned, their number is not changed).

What it measures, per mode: output tok/s alone (mean of A and B over the reps) and in parallel,
the ratio parallel/alone (the mean of the per-server, per-rep ratios, with min and max), TTFT p50
alone and in parallel and their ratio, and the goodput ratio. Writes a JSON
(``benchmarks/results/interference.json`` by default) with the setup (overrides, params, each
server's argv, GPUs, CPU plan, cores, reps, wall time), every replay's row and the per-mode
summary; the servers' logs go to ``--log-dir`` (default ``outputs/interference/<time>/``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import platform
import signal
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # runnable as a plain script from anywhere
    sys.path.insert(0, str(ROOT))

from _cli import split_overrides  # noqa: E402

from tuner.checks import load_config  # noqa: E402
from tuner.config import TunerConfig  # noqa: E402
from tuner.engine.argv import (  # noqa: E402
    api_key,
    build_env,
    cache_root,
    mask_argv,
    secret_values,
    trial_argv,
)
from tuner.engine.pool import cpu_plan, thread_ids  # noqa: E402
from tuner.engine.process import Server, free_port, kill_all_groups, proc_table  # noqa: E402
from tuner.errors import ConfigError, TrialFailed  # noqa: E402
from tuner.measure import reset_caches  # noqa: E402
from tuner.records import RequestRecord, RequestSpec  # noqa: E402
from tuner.replay import choose_client, replay  # noqa: E402
from tuner.score import summarize  # noqa: E402
from tuner.workload import build_requests  # noqa: E402

log = logging.getLogger("interference")

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "interference.json"
MODES = ("unpinned", "pinned")
SIM_OVERRIDES = [
    "+workload=chat",
    "workload.num_requests=60",
    "workload.arrival.concurrency=16",
    "engine.gpus=[0,1]",
]
FEW_CORES = 6
"""Below this many cores the default (simulator) run keeps no core for itself (cpu_reserve=0)."""
DEV_MODE = "VLLM_SERVER_DEV_MODE"


# --- CPU affinity of running processes --------------------------------------------------------


def server_pids(pid: int, pgid: int) -> list[int]:
    """The server's processes: its process group, and every descendant of ``pid``."""
    table = proc_table()
    found = {p for p, (_, g) in table.items() if g == pgid}
    if pid in table:
        found.add(pid)
    grew = True
    while grew:  # descendants that left the group (setsid), transitively
        grew = False
        for p, (ppid, _) in table.items():
            if ppid in found and p not in found:
                found.add(p)
                grew = True
    return sorted(found)


def set_affinity(pids: list[int], cpus: list[int]) -> int:
    """Every thread of ``pids`` onto ``cpus``; the number of threads set (vanished ones skipped)."""
    n = 0
    for pid in pids:
        for tid in thread_ids(pid):
            try:
                os.sched_setaffinity(tid, cpus)
                n += 1
            except (ProcessLookupError, FileNotFoundError):
                continue  # the thread ended meanwhile
            except OSError as exc:
                log.warning("cannot set the affinity of thread %d of pid %d: %s", tid, pid, exc)
    return n


def read_affinity(pids: list[int]) -> list[list[int]]:
    """The CPU affinity of every live thread of ``pids``."""
    out = []
    for pid in pids:
        for tid in thread_ids(pid):
            with contextlib.suppress(ProcessLookupError, FileNotFoundError, PermissionError):
                out.append(sorted(os.sched_getaffinity(tid)))
    return out


# --- the two servers -------------------------------------------------------------------------


@dataclass
class Bench:
    name: str
    """``A`` or ``B``."""
    gpu: int
    server: Server
    shown_argv: list[str]
    planned_cpus: list[int]
    """Its cores in the pinned mode."""


def compose(overrides: list[str], log_dir: Path) -> TunerConfig:
    """The tuner config as ``python -m tuner`` composes it (paths.output_dir: the log dir)."""
    extra = []
    if not any(o.lstrip("+").startswith("workload=") for o in overrides):
        extra.append("+workload=chat")
    if not any(o.startswith("paths.output_dir=") for o in overrides):
        extra.append(f"paths.output_dir={log_dir}")
    return load_config(extra + overrides)


def make_servers(
    cfg: TunerConfig,
    params: dict[str, Any],
    baseline: bool,
    plan: dict[int, list[int]],
    log_dir: Path,
) -> list[Bench]:
    """A server per GPU of the first two of ``engine.gpus``, as ``_run_server`` builds one."""
    cache_dir = cache_root(cfg)
    secrets = secret_values(cfg.engine, model=cfg.model)
    out = []
    for name, gpu in zip("AB", cfg.engine.gpus[:2], strict=True):
        port = free_port(cfg.engine.host)
        argv = trial_argv(cfg, params, port=port, baseline=baseline)
        engine = replace(cfg.engine, gpus=[gpu])  # CUDA_VISIBLE_DEVICES = this GPU
        env = build_env(engine, cache_root=cache_dir)
        env.setdefault(DEV_MODE, "1")  # vLLM mounts /reset_prefix_cache only in dev mode
        server = Server(
            argv,
            env=env,
            log_path=log_dir / f"server_{name}_gpu{gpu}.log",
            host=cfg.engine.host,
            port=port,
            startup_timeout_s=cfg.engine.startup_timeout_s,
            stop_timeout_s=cfg.engine.stop_timeout_s,
            health_interval_s=cfg.engine.health_interval_s,
        )  # not pinned at launch: the modes set the affinity at runtime
        out.append(Bench(name, gpu, server, mask_argv(argv, secrets), plan[gpu]))
    return out


def apply_mode(
    mode: str, benches: list[Bench], cores: list[int], reserved: list[int]
) -> dict[str, int]:
    """Set the mode's affinity on every thread of both servers and of this process; the number
    of threads set, per server (and ``self``)."""
    out = {}
    for b in benches:
        assert b.server.proc is not None and b.server.pgid is not None
        cpus = b.planned_cpus if mode == "pinned" else cores
        out[b.name] = set_affinity(server_pids(b.server.proc.pid, b.server.pgid), cpus)
    own = reserved if mode == "pinned" and reserved else cores
    out["self"] = set_affinity([os.getpid()], own)
    return out


def check_mode(mode: str, b: Bench, cores: list[int]) -> dict[str, Any]:
    """Read the affinity back: the server's main pid, and how many of its threads are on target."""
    assert b.server.proc is not None and b.server.pgid is not None
    target = b.planned_cpus if mode == "pinned" else cores
    threads = read_affinity(server_pids(b.server.proc.pid, b.server.pgid))
    try:
        main = sorted(os.sched_getaffinity(b.server.proc.pid))
    except OSError:
        main = []
    return {
        "cpus_target": target,
        "cpus_read_back": main,
        "tasks_checked": len(threads),
        "tasks_on_plan": sum(t == target for t in threads),
    }


# --- one replay ------------------------------------------------------------------------------


async def run_replay(
    cfg: TunerConfig, b: Bench, requests: list[RequestSpec], t0: float
) -> tuple[list[RequestRecord], float, float]:
    """The tuner's client on ``b``; the records, and the measured start and end (s since t0)."""
    w = cfg.workload
    started: list[float] = []
    records = await replay(
        b.server.base_url,
        cfg.model.served_name,
        requests,
        w.arrival,
        duration_s=w.duration_s,
        request_timeout_s=w.request_timeout_s,
        api_key=api_key(cfg.engine, cfg.model),
        on_start=started.append,
        processes=choose_client(w, cfg.engine, requests).processes,  # as tuner.measure does
    )
    start = (started[0] if started else time.perf_counter()) - t0
    return records, start, time.perf_counter() - t0


async def replays(
    cfg: TunerConfig,
    run: str,
    on: list[Bench],
    requests: list[RequestSpec],
    ctx: dict[str, Any],
    cores: list[int],
    t0: float,
) -> list[dict[str, Any]]:
    """Reset the caches of the servers ``on``, replay on them at once, one row per server."""
    key = api_key(cfg.engine, cfg.model)
    reset = [await reset_caches(b.server.base_url, key) for b in on]
    log.info(
        "rep %d/%d · %s · %s: replaying %d requests on %s",
        ctx["rep"] + 1,
        ctx["reps"],
        ctx["mode"],
        run,
        len(requests),
        " and ".join(f"{b.name} (GPU {b.gpu})" for b in on),
    )
    results = await asyncio.gather(*(run_replay(cfg, b, requests, t0) for b in on))
    rows = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as http:
        for b, ok_reset, (records, start, end) in zip(on, reset, results, strict=True):
            await b.server.check(http)  # ReplayFailed if the engine died
            m = summarize(records, cfg.workload.slo)
            measured = int(m["completed"] + m["failed"])
            row = {
                "rep": ctx["rep"],
                "mode": ctx["mode"],
                "server": b.name,
                "gpu": b.gpu,
                "run": run,
                "output_throughput": m["output_throughput"],
                "ttft_p50_ms": m.get("ttft_p50_ms"),
                "tpot_p50_ms": m.get("tpot_p50_ms"),
                "goodput": m["goodput"],
                "requests": measured,
                "requests_ok": int(m["completed"]),
                "all_ok": measured > 0 and m["failed"] == 0,
                "caches_reset": ok_reset,
                "tasks_pinned": ctx["tasks_pinned"][b.name],
                "own_tasks_pinned": ctx["tasks_pinned"]["self"],
                "own_cpus": sorted(os.sched_getaffinity(0)),
                **check_mode(ctx["mode"], b, cores),
                "t_start_s": round(start, 3),
                "t_end_s": round(end, 3),
                "metrics": m,
            }
            rows.append(row)
            log.info(
                "  %s %s: %s tok/s, TTFT p50 %s ms, goodput %s req/s, %d/%d ok%s",
                b.name,
                run,
                _f(row["output_throughput"], ",.1f"),
                _f(row["ttft_p50_ms"], ",.0f"),
                _f(row["goodput"], ".2f"),
                row["requests_ok"],
                measured,
                "" if ok_reset else " (caches not reset)",
            )
    return rows


# --- summary ---------------------------------------------------------------------------------


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _stats(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "min": None, "max": None}
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values)}


def summarize_mode(rows: list[dict[str, Any]], mode: str) -> dict[str, Any]:
    """Means over servers and reps, and per-server-per-rep ratios parallel/alone."""
    mine = [r for r in rows if r["mode"] == mode]

    def mean(run: str, key: str) -> float | None:
        vals = [r[key] for r in mine if r["run"] == run and r[key] is not None]
        return statistics.fmean(vals) if vals else None

    ratios: dict[str, list[float]] = {"output_throughput": [], "ttft_p50_ms": [], "goodput": []}
    for a in (r for r in mine if r["run"] == "alone"):
        p = next(
            r
            for r in mine
            if r["run"] == "parallel" and r["rep"] == a["rep"] and r["server"] == a["server"]
        )
        for key, vals in ratios.items():
            q = _ratio(p[key], a[key])
            if q is not None:
                vals.append(q)
    return {
        "mode": mode,
        "replays": len(mine),
        "all_ok": all(r["all_ok"] for r in mine),
        "caches_reset": all(r["caches_reset"] for r in mine),
        **{f"{k}_{run}": mean(run, k) for k in ratios for run in ("alone", "parallel")},
        **{f"ratio_{k}": _stats(v) for k, v in ratios.items()},
    }


def _f(v: float | None, spec: str) -> str:
    return format(v, spec) if v is not None else "n/a"


def print_table(summary: list[dict[str, Any]]) -> None:
    print()
    print(
        "| mode | alone tok/s | parallel tok/s | par/alone tok/s (min–max) "
        "| TTFT p50 alone | TTFT p50 par | TTFT ratio | goodput ratio |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for s in summary:
        t = s["ratio_output_throughput"]
        print(
            f"| {s['mode']} | {_f(s['output_throughput_alone'], ',.1f')} "
            f"| {_f(s['output_throughput_parallel'], ',.1f')} "
            f"| {_f(t['mean'], '.3f')} ({_f(t['min'], '.3f')}–{_f(t['max'], '.3f')}) "
            f"| {_f(s['ttft_p50_ms_alone'], ',.0f')} ms "
            f"| {_f(s['ttft_p50_ms_parallel'], ',.0f')} ms "
            f"| {_f(s['ratio_ttft_p50_ms']['mean'], '.3f')} "
            f"| {_f(s['ratio_goodput']['mean'], '.3f')} |"
        )


# --- main ------------------------------------------------------------------------------------


async def run(args: argparse.Namespace, overrides: list[str]) -> dict[str, Any]:
    t_start = time.perf_counter()
    cores = sorted(os.sched_getaffinity(0))
    log_dir: Path = args.log_dir
    cfg = compose(overrides, log_dir)
    if len(cfg.engine.gpus) < 2:
        raise ConfigError(f"engine.gpus is {cfg.engine.gpus}: two GPUs needed, one per server")
    gpus = cfg.engine.gpus[:2]
    reserve = cfg.engine.cpu_reserve
    try:
        plan = cpu_plan(gpus, cores, reserve)
    except ValueError as exc:
        raise ConfigError(f"no CPU plan: {exc}") from exc
    reserved = cores[:reserve]
    params: dict[str, Any] = json.loads(args.params) if args.params else {}
    requests = build_requests(cfg.workload, cfg.model.files)
    benches = make_servers(cfg, params, not args.params, plan, log_dir)
    log.info(
        "%s engine, model %s, workload %s (%d requests, %d warm-up); %d cores %s, reserve %d; "
        "pinned plan %s; server logs in %s",
        cfg.engine.kind,
        cfg.model.name,
        cfg.workload.name,
        sum(not r.warmup for r in requests),
        sum(r.warmup for r in requests),
        len(cores),
        cores,
        reserve,
        {g: c for g, c in plan.items()},
        log_dir,
    )
    rows: list[dict[str, Any]] = []
    launches: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    try:
        log.info("starting servers A (GPU %d) and B (GPU %d) at once", gpus[0], gpus[1])
        started = await asyncio.gather(*(b.server.start() for b in benches), return_exceptions=True)
        for b, res in zip(benches, started, strict=True):
            if isinstance(res, BaseException):
                tail = "\n".join(b.server.log_lines()[-20:])
                raise SystemExit(f"server {b.name} (GPU {b.gpu}) did not start: {res}\n{tail}")
            launches.append(
                {
                    "server": b.name,
                    "gpu": b.gpu,
                    "pid": res.pid,
                    "pgid": b.server.pgid,
                    "port": res.port,
                    "startup_s": res.startup_s,
                    "engine_version": res.facts.engine_version,
                    "kv_cache_tokens": res.facts.kv_cache_tokens,
                    "log": str(b.server.log_path),
                }
            )
            log.info("server %s ready in %.1f s (pid %d)", b.name, res.startup_s, res.pid)
        a, b = benches
        runs = [("alone", [a]), ("alone", [b]), ("parallel", [a, b])]
        for rep in range(args.reps):
            order = MODES if rep % 2 == 0 else MODES[::-1]  # ABBA over the reps
            for mode in order:
                ctx: dict[str, Any] = {"rep": rep, "reps": args.reps, "mode": mode}
                for run_name, on in runs:
                    ctx["tasks_pinned"] = apply_mode(mode, benches, cores, reserved)
                    rows += await replays(cfg, run_name, on, requests, ctx, cores, t0)
                # so far, in case a time limit stops the run (main() overwrites it at the end)
                args.out.parent.mkdir(parents=True, exist_ok=True)
                partial = {"benchmark": "interference", "partial": True, "overrides": overrides}
                partial["servers"] = launches
                partial["rows"] = rows
                partial["summary"] = [summarize_mode(rows, m) for m in MODES]
                args.out.write_text(json.dumps(partial, indent=2, default=str) + "\n")
    finally:
        await asyncio.shield(asyncio.gather(*(b.server.stop() for b in benches)))
        set_affinity([os.getpid()], cores)
        for b, launch in zip(benches, launches, strict=False):
            launch["survivors"] = list(b.server.survivors)
    summary = [summarize_mode(rows, m) for m in MODES]
    print_table(summary)
    return {
        "benchmark": "interference",
        "setup": {
            "overrides": overrides,
            "params": params,
            "baseline": not args.params,
            "engine": cfg.engine.kind,
            "model": cfg.model.name,
            "workload": cfg.workload.name,
            "requests": sum(not r.warmup for r in requests),
            "warmup_requests": sum(r.warmup for r in requests),
            "concurrency": cfg.workload.arrival.concurrency,
            "gpus": gpus,
            "cores": cores,
            "cpu_reserve": reserve,
            "reserved_cores": reserved,
            "cpu_plan": {str(g): c for g, c in plan.items()},
            "argv": {b.name: b.shown_argv for b in benches},
            "servers": launches,
            "reps": args.reps,
            "modes": list(MODES),
            "host": platform.node(),
            "wall_s": round(time.perf_counter() - t_start, 1),
        },
        "rows": rows,
        "summary": summary,
    }


def _sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args_in, overrides = split_overrides(argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--reps", type=int, default=2, help="repetitions of both modes (default 2)")
    ap.add_argument(
        "--params",
        help="searched params as JSON (e.g. '{\"max_num_seqs\": 256}'); default: vLLM's defaults",
    )
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--log-dir", type=Path, help="server logs (default outputs/interference/TIME)")
    args = ap.parse_args(args_in)
    if args.reps < 1:
        ap.error("--reps must be at least 1")
    if args.params:
        try:
            if not isinstance(json.loads(args.params), dict):
                raise ValueError("not an object")
        except ValueError as exc:
            ap.error(f"--params: a JSON object expected ({exc})")
    if not overrides:  # the simulator, small and quick
        overrides = list(SIM_OVERRIDES)
        if len(os.sched_getaffinity(0)) < FEW_CORES:
            overrides.append("engine.cpu_reserve=0")  # a small machine: every core to servers
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stdout
    )
    if args.log_dir is None:
        args.log_dir = Path("outputs") / "interference" / time.strftime("%Y-%m-%d_%H-%M-%S")
    args.log_dir = args.log_dir.resolve()
    args.log_dir.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, _sigterm)
    try:
        result = asyncio.run(run(args, overrides))
    except KeyboardInterrupt:
        kill_all_groups()
        print("interrupted; the servers are stopped", file=sys.stderr)
        return 130
    except (ConfigError, TrialFailed) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigError) else 1
    finally:
        kill_all_groups()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
