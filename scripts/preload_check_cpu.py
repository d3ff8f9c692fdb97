"""engine.preload against real vLLM 0.24.0 on a machine without a GPU: does `vllm serve`, forked
from the zygote, run the same code as when launched as a process?

Without a GPU, vLLM cannot infer its device; a stand-in platform plugin (vLLM's
``vllm.platform_plugins`` entry point) returning vLLM's own ``CpuPlatform`` lets `vllm serve` run
through its argument parsing, config and EngineCore start until the CUDA wheel's missing CPU
kernels stop it. Each launch goes through the tuner's ``Server`` (plain, then preloaded,
interleaved); the row says how long after the launch the API server's first line and the
EngineCore's first line came (the log's one-second stamps), how it failed, and how many lines
it logged. The CPU platform always spawns the EngineCore, so only the first time can move.

Set-up (about 9 GB; the wheel is the one staged for the H200)::

    python3 -m venv /tmp/vv
    /tmp/vv/bin/pip install vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl

Then, from the checkout with the tuner's venv: ``python scripts/preload_check_cpu.py
[--vllm /tmp/vv/bin/vllm] [--rounds 3]``; it writes the stand-in plugin (``fakeplat``) into that
venv's site-packages the first time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner.engine.process import Preload, Server, free_port  # noqa: E402
from tuner.engine.startup_log import log_time  # noqa: E402
from tuner.errors import LaunchFailed  # noqa: E402

PLUGIN = {
    "fakeplat/__init__.py": 'def register():\n    return "vllm.platforms.cpu.CpuPlatform"\n',
    "fakeplat-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: fakeplat\nVersion: 0.1\n",
    "fakeplat-0.1.dist-info/entry_points.txt": (
        "[vllm.platform_plugins]\nfakecpu = fakeplat:register\n"
    ),
}


def install_plugin(vllm: str) -> None:
    """The stand-in platform in the site-packages of ``vllm``'s interpreter (its ``#!`` line)."""
    python = Path(vllm).read_text().splitlines()[0][2:].strip()
    out = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    site = Path(out.stdout.strip())
    for rel, text in PLUGIN.items():
        if not (site / rel).exists():
            (site / rel).parent.mkdir(parents=True, exist_ok=True)
            (site / rel).write_text(text)


async def launch(vllm: str, modules: tuple[str, ...], work: Path, name: str) -> dict[str, object]:
    port = free_port()
    argv = [vllm, "serve", str(ROOT / "models" / "qwen3-8b-dummy"), "--load-format", "dummy"]
    argv += ["--max-model-len", "4096", "--host", "127.0.0.1", "--port", str(port)]
    log_path = work / f"{name}.log"
    preloaded = name.startswith("preload")
    server = Server(
        argv,
        env={**os.environ, "VLLM_NO_USAGE_STATS": "1", "PYTHONUNBUFFERED": "1"},
        log_path=log_path,
        host="127.0.0.1",
        port=port,
        startup_timeout_s=120,
        stop_timeout_s=5,
        health_interval_s=0.2,
        preload=Preload(modules, work / "zygote.log") if preloaded else None,
    )
    t0, failed = time.time(), "ready"
    try:
        async with server:
            pass
    except LaunchFailed as exc:
        failed = f"{exc.reason.value}: {str(exc)[:80]}"
    lines = log_path.read_text().splitlines()
    year = time.localtime(t0).tm_year

    def first(needle: str) -> float | None:
        t = next((log_time(x, year) for x in lines if needle in x and log_time(x, year)), None)
        return None if t is None else round(t - t0, 1)

    return {
        "launch": name,
        "first_line_s": first("(APIServer"),
        "engine_core_s": first("Initializing a V1 LLM engine"),
        "ended": failed,
        "lines": len(lines),
    }


async def main_async(vllm: str, rounds: int) -> None:
    conf = yaml.safe_load((ROOT / "conf" / "engine" / "vllm.yaml").read_text())
    modules = tuple(conf["preload_modules"])  # engine=vllm's, as a study would preload
    with tempfile.TemporaryDirectory(prefix="preload-check-") as tmp:
        for r in range(rounds):
            for kind in ("plain", "preload"):
                print(await launch(vllm, modules, Path(tmp), f"{kind}-{r}"), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--vllm", default="/tmp/vv/bin/vllm")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    install_plugin(args.vllm)
    asyncio.run(main_async(args.vllm, args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
