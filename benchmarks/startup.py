"""Where a launch's start-up time goes, cold and warm compile cache (issue #22).

Usage::

    python benchmarks/startup.py [--engine sim|vllm] [--model PATH] [--hold-s S] [--out PATH]
        [--configs A,B] [--passes cold,warm,study,launchers] [--launchers A,B] [--repeat N]
        [--logs DIR] [-- TUNER OVERRIDES...]

On the H200::

    python benchmarks/startup.py --engine vllm --configs defaults,gmu_0.80 --passes cold,warm
    python benchmarks/startup.py --engine vllm --configs defaults --passes cold,launchers \
        --launchers plain,preload,fork,preload_fork --repeat 2

Launches a fixed list of configs (:data:`CONFIGS`: vLLM's defaults, a max_num_batched_tokens
change, a gpu_memory_utilization change (the same compile key as the defaults) and a block_size
change) through the tuner's own launcher (``trial_argv``, ``build_env``,
:class:`tuner.engine.process.Server`), one server at a time, in three passes:

* ``cold``: each config once on a fresh compile cache (``engine.cache_root``: a new folder);
* ``warm``: each config once more on that cache;
* ``study``: a study-like order (:data:`STUDY`, configs coming back) on another fresh cache, each
  launch in the order the tuner would pick among them (:func:`tuner.compile_cache.warm_first`
  over the launches left, as the tuner orders its queue);
* ``launchers``: on the cold pass's cache (run ``cold`` first, so every launch is a hit), each
  config ``--repeat`` times under each of ``--launchers`` (:data:`LAUNCHERS`), interleaved:
  ``plain`` (a new process with the CLI's spawn, as ``vllm serve`` starts: the tuner's
  ``engine.preload=false`` without ``engine.env.VLLM_WORKER_MULTIPROC_METHOD``), ``preload``
  (``engine.preload``: forked from one zygote, :mod:`tuner.engine.preload`, started before the
  pass: no timed launch waits for its imports, which are reported apart),
  ``fork`` (``VLLM_WORKER_MULTIPROC_METHOD=fork``: vLLM forks its EngineCore instead of the CLI's
  spawn, which imports everything again; the simulator ignores it), ``preload_fork`` (both:
  the tuner's default for ``engine=vllm``). The other passes launch ``plain``.
  Each launcher's summary, and its median ready time and phases as a ratio to ``plain``'s.

Each server stays up ``--hold-s`` after it is ready (a stand-in for the replay: 20 s on vLLM, a
chat trial's replay took 15-25 s on the H200; 0 on the simulator), then is stopped. Each launch's
row: its ready time split into phases from its log (:mod:`tuner.engine.startup_log`), the compile
cache's hit or miss and vLLM's key, the seconds the server was held. Per pass and for the whole
run: ``median_ready_s`` and ``startup_share`` (server seconds before ready ÷ server seconds held),
the phase medians, hits and misses (:func:`tuner.startup.launch_summary`). Writes
``benchmarks/results/startup-<gpu>.json`` (the GPU's NVML name, ``sim`` on the simulator).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _cli import split_overrides  # noqa: E402

from tuner.checks import load_config  # noqa: E402
from tuner.compile_cache import record, warm_first  # noqa: E402
from tuner.config import TunerConfig  # noqa: E402
from tuner.engine import preload  # noqa: E402
from tuner.engine.argv import build_env, compile_key, params_key, trial_argv  # noqa: E402
from tuner.engine.process import Preload, Server, free_port, kill_all_groups  # noqa: E402
from tuner.engine.startup_log import PHASES  # noqa: E402
from tuner.records import LaunchInfo, to_jsonable  # noqa: E402
from tuner.startup import launch_summary  # noqa: E402

CONFIGS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "mbt_4096": {"max_num_batched_tokens": 4096},
    "gmu_0.80": {"gpu_memory_utilization": 0.8},  # not in vLLM's compile key
    "block_32": {"block_size": 32},
}
PASSES = ("cold", "warm", "study", "launchers")
LAUNCHERS = ("plain", "preload", "fork", "preload_fork")
STUDY = ["block_32", "defaults", "mbt_4096", "gmu_0.80", "block_32", "defaults"]


def gpu_slug(cfg: TunerConfig) -> str:
    """``sim`` on the simulator, else the first GPU's NVML name (``h200`` of ``NVIDIA H200``)."""
    if cfg.engine.kind == "sim":
        return "sim"
    import pynvml

    pynvml.nvmlInit()
    try:
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(cfg.engine.gpus[0]))
    finally:
        pynvml.nvmlShutdown()
    name = name.decode() if isinstance(name, bytes) else str(name)
    return name.lower().replace("nvidia", "").strip().replace(" ", "-") or "gpu"


async def launch(
    cfg: TunerConfig,
    name: str,
    root: Path,
    hold_s: float,
    log_dir: Path,
    k: int,
    launcher: str = "plain",
) -> dict[str, Any]:
    port = free_port(cfg.engine.host)
    argv = trial_argv(cfg, CONFIGS[name], port=port, baseline=False)
    env = launch_env(cfg, root, launcher)
    forked = Preload.of(cfg.engine, log_dir / "zygote.log") if "preload" in launcher else None
    server = Server(
        argv,
        env=env,
        preload=forked,
        log_path=log_dir / f"{k:02d}-{name}.log",
        host=cfg.engine.host,
        port=port,
        startup_timeout_s=cfg.engine.startup_timeout_s,
        stop_timeout_s=cfg.engine.stop_timeout_s,
        health_interval_s=cfg.engine.health_interval_s,
    )
    async with server as info:
        await asyncio.sleep(hold_s)
    record(root, compile_key(cfg, argv), info.startup)  # the tuner's index, as a trial writes it
    startup = info.startup
    row = {
        "config": name,
        "launcher": launcher,
        "ready_s": info.startup_s,
        "held_s": server.lifetime_s,
        "phases": startup.phases if startup else {},
        "compile_cache": startup.compile_cache if startup else None,
        "compile_hash": startup.compile_hash if startup else None,
        "engine_version": info.facts.engine_version,
        "_launch": info,
    }
    phases = " ".join(f"{p} {row['phases'][p]:.1f}" for p in PHASES if p in row["phases"])
    print(
        f"  {name:10s} {launcher:12s} ready {info.startup_s:6.1f} s  "
        f"cache {row['compile_cache']}  {phases}"
    )
    return row


def launch_env(cfg: TunerConfig, root: Path, launcher: str) -> dict[str, str]:
    """A launch's environment: the engine's, on the compile cache ``root``, with ``fork``'s
    variable for the launchers that name it and without it for the others (the engine's
    config sets it by default)."""
    env = build_env(cfg.engine, cache_root=root)
    env.pop("VLLM_WORKER_MULTIPROC_METHOD", None)
    if "fork" in launcher.split("_"):
        env["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"
    return env


def start_zygotes(cfg: TunerConfig, root: Path, log_dir: Path, launchers: list[str]) -> None:
    """Each preloading launcher's zygote, started before the timed launches: in a study only
    the first server waits for its imports (~22 s on an H100, 2026-12-05), so a launch that
    waited for them would not show what every later one costs. Their import times are in the
    JSON apart (``zygote_import_s``). A zygote that cannot start is said; its launches then
    start processes, as the tuner's would."""
    argv = trial_argv(cfg, CONFIGS["defaults"], port=0, baseline=False)
    p = Preload.of(cfg.engine, log_dir / "zygote.log")
    for launcher in (n for n in launchers if "preload" in n):
        try:
            z = preload.zygote_for(
                argv,
                launch_env(cfg, root, launcher),
                modules=p.modules,
                zygote_log=p.zygote_log,
                timeout_s=cfg.engine.startup_timeout_s,
                per_launch=p.per_launch,
            )
        except preload.PreloadError as exc:
            print(f"  {launcher}: no zygote ({exc}): its launches start processes")
            continue
        print(f"  {launcher}: zygote ready, its imports took {z.import_s or 0.0:.1f} s (not timed)")


def summary(rows: list[dict[str, Any]]) -> dict[str, float]:
    launches: list[LaunchInfo] = [r["_launch"] for r in rows]
    before = sum(r["ready_s"] for r in rows)
    return launch_summary(launches, before, sum(r["held_s"] for r in rows))


def by_launcher(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each launcher's :func:`summary`, and its median ready time and phases over ``plain``'s."""
    out = {n: summary([r for r in rows if r["launcher"] == n]) for n in LAUNCHERS}
    out = {n: s for n, s in out.items() if s}
    plain = out.get("plain", {})
    for s in out.values():
        for key in [k for k in s if k.startswith("median_") and plain.get(k)]:
            s[f"{key}_vs_plain"] = round(s[key] / plain[key], 3)
    return out


async def run(
    cfg: TunerConfig,
    hold_s: float,
    work: Path,
    configs: list[str],
    passes_asked: list[str],
    launchers: list[str] = ["plain"],  # noqa: B006 - never mutated
    repeat: int = 1,
) -> dict[str, Any]:
    passes: dict[str, list[dict[str, Any]]] = {}
    cold_root, study_root = work / "cache-cold", work / "cache-study"
    k = 0
    for pass_name, root, order in (
        ("cold", cold_root, configs),
        ("warm", cold_root, configs),
        ("study", study_root, [n for n in STUDY if n in configs]),
    ):
        if pass_name not in passes_asked:
            continue
        print(f"{pass_name} pass (VLLM_CACHE_ROOT={root})")
        rows = []
        left = order
        while left:  # the study pass: the tuner's warm-first pick among the launches left
            if pass_name == "study":
                left = warm_first(left, lambda n: params_key(cfg, CONFIGS[n]), root)
            name, left = left[0], left[1:]
            k += 1
            rows.append(await launch(cfg, name, root, hold_s, work / "logs", k))
        passes[pass_name] = rows
    if "launchers" in passes_asked:
        print(f"launchers pass (VLLM_CACHE_ROOT={cold_root}): {', '.join(launchers)}")
        await asyncio.to_thread(start_zygotes, cfg, cold_root, work / "logs", launchers)
        rows = []
        for _ in range(repeat):
            for name in configs:
                for launcher in launchers:
                    k += 1
                    rows.append(
                        await launch(cfg, name, cold_root, hold_s, work / "logs", k, launcher)
                    )
        passes["launchers"] = rows
    every = [r for rows in passes.values() for r in rows]
    out: dict[str, Any] = {
        "engine": cfg.engine.kind,
        "model": cfg.model.path,
        "hold_s": hold_s,
        "configs": {n: CONFIGS[n] for n in configs},
        "summary": summary(every),
        # each zygote's own imports, before the timed launches (start_zygotes)
        "zygote_import_s": [z.import_s for z in preload._ZYGOTES.values()],
        "passes": {
            n: {
                "summary": summary(rows),
                **({"by_launcher": by_launcher(rows)} if n == "launchers" else {}),
                "launches": [{k: v for k, v in r.items() if k != "_launch"} for r in rows],
            }
            for n, rows in passes.items()
        },
    }
    return out


def main(argv: list[str] | None = None) -> int:
    args_in, overrides = split_overrides(argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--engine", choices=("sim", "vllm"), default="sim")
    ap.add_argument(
        "--model", help="model=custom model.path=MODEL (default: the shipped qwen3-8b shape)"
    )
    ap.add_argument("--hold-s", type=float, help="seconds each server stays up after ready")
    ap.add_argument("--out", type=Path, help="default benchmarks/results/startup-<gpu>.json")
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"a subset of {','.join(CONFIGS)}")
    ap.add_argument("--passes", default="cold,warm,study", help=f"a subset of {','.join(PASSES)}")
    ap.add_argument(
        "--launchers", default="plain,preload", help=f"a subset of {','.join(LAUNCHERS)}"
    )
    ap.add_argument("--repeat", type=int, default=1, help="launches per config and launcher")
    ap.add_argument("--logs", type=Path, help="copy every server's log here (default: dropped)")
    args = ap.parse_args(args_in)
    configs, passes = args.configs.split(","), args.passes.split(",")
    launchers = args.launchers.split(",")
    bad = [c for c in configs if c not in CONFIGS] + [p for p in passes if p not in PASSES]
    if bad := bad + [n for n in launchers if n not in LAUNCHERS]:
        ap.error(f"unknown config, pass or launcher: {', '.join(bad)}")
    logging.basicConfig(level=logging.WARNING, stream=sys.stdout)
    with tempfile.TemporaryDirectory(prefix="startup-bench-") as tmp:
        work = Path(tmp)
        base = [f"engine={args.engine}", "+workload=chat", f"paths.output_dir={work / 'run'}"]
        if args.model:  # a model of your own (a directory or a repo id); the shipped shapes refuse
            base += ["model=custom", f"model.path={args.model}"]
        cfg = load_config(base + overrides)
        hold_s = args.hold_s if args.hold_s is not None else (20.0 if args.engine == "vllm" else 0)
        t0 = time.monotonic()
        try:
            result = asyncio.run(
                run(cfg, hold_s, work, configs, passes, launchers, max(1, args.repeat))
            )
        except KeyboardInterrupt:
            kill_all_groups()
            return 130
        result["wall_s"] = round(time.monotonic() - t0, 1)
        result["gpu"] = gpu_slug(cfg)
        if args.logs:  # the servers' logs (and the zygote's) outlive the work folder
            shutil.copytree(work / "logs", args.logs, dirs_exist_ok=True)
    out = args.out or ROOT / "benchmarks" / "results" / f"startup-{result['gpu']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(to_jsonable(result), indent=1) + "\n")
    s = result["summary"]
    print(
        f"median ready {s.get('median_ready_s', 0):.1f} s, start-up share "
        f"{s.get('startup_share', 0):.0%}, compile cache {s.get('compile_cache_hits', 0):.0f} "
        f"hit(s) / {s.get('compile_cache_misses', 0):.0f} miss(es); wrote {out}"
    )
    for name, ls in result["passes"].get("launchers", {}).get("by_launcher", {}).items():
        ratio = ls.get("median_ready_s_vs_plain")
        print(
            f"  {name:12s} median ready {ls.get('median_ready_s', 0):6.1f} s"
            + (f" ({ratio:.2f}x plain)" if ratio else "")
            + f", process {ls.get('median_startup_process_s', 0):.1f} s"
            + f", api {ls.get('median_startup_api_s', 0):.1f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
