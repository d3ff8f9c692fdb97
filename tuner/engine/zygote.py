"""A preloaded interpreter that forks engine servers (``engine.preload``): the process side.

Run as a file by the engine's own interpreter (``<python> zygote.py ENTRY [MODULE ...]``), it
imports ENTRY's module and the MODULEs once, then forks one child per request; each child is a
server as a launch would start it: its own session (process group), the request's environment,
working directory and argv, stdout and stderr to the request's log file, ENTRY called as its
``main``. A launch then skips the interpreter's start and those imports: `vllm serve`'s
"process" phase, 16-28 s on the H200 (docs/gpu-runs/2026-12-05-capacity-study.md).

ENTRY is ``module:function`` (a console script's entry point, e.g. vLLM's
``vllm.entrypoints.cli.main:main``) or ``-m module`` (``python -m``). Stdlib only: the engine's
interpreter need not have the tuner installed. The tuner side is :mod:`tuner.engine.preload`.

Protocol: JSON lines. The zygote's stdout carries only these (anything the imports print goes to
its stderr): first ``{"ready": pid, "import_s": s, "failed": [module: error]}`` or ``{"error":
"..."}``; then per request line ``{"argv", "env", "cwd", "log", "cpus"}`` on stdin (``cpus``:
the cores to pin the server to, or null), ``{"pid": pid}`` or ``{"error": "..."}``; whenever a
child ends, ``{"exit": pid, "code": code}`` (a negative code: the signal). End of stdin: the
zygote SIGKILLs the process group of every server still running and exits. That is also how a
tuner killed with ``kill -9`` leaves no server behind: a forked server's ``/proc/<pid>/environ``
is the zygote's, which lacks the lease marker ``tuner.recovery`` looks for.

Why a fork here is safe: it preloads only modules that `vllm serve`'s API server itself imports
before it starts its EngineCore process, which vLLM forks from that state when
``VLLM_WORKER_MULTIPROC_METHOD=fork``; the zygote refuses to serve if the imports initialised
CUDA (``torch.cuda.is_initialized()``).
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import signal
import sys
import time
import traceback

__all__ = ["main"]

_OUT = -1  # the protocol's fd (the zygote's original stdout)
_CHILDREN: set[int] = set()  # forked servers not yet reaped
_START_ENV: dict[str, str] = {}  # the environment before the imports
_IMPORTED_ENV: dict[str, str | None] = {}  # what the imports set (None: removed)


def _send(msg: dict) -> None:
    data = (json.dumps(msg) + "\n").encode()
    while data:  # a short line: one write, atomic on a pipe; loop only if interrupted
        n = os.write(_OUT, data)
        data = data[n:]


def _reap(signum: int = 0, frame: object = None) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _CHILDREN.discard(pid)
        _send({"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def _load(entry: str) -> object:
    """The callable that runs ENTRY with ``sys.argv`` set, ``sys.path[0]`` first set as the
    interpreter would have set it: the working directory for ``python -m``, the script's folder
    for a console script."""
    if entry.startswith("-m "):
        module = entry[3:].strip()

        def run_module() -> None:
            sys.path.insert(0, os.getcwd())
            runpy.run_module(module, run_name="__main__", alter_sys=True)

        return run_module
    module, _, func = entry.partition(":")
    obj: object = importlib.import_module(module)
    for part in func.split("."):
        obj = getattr(obj, part)

    def run_script() -> object:
        sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
        return obj()  # type: ignore[operator]

    return run_script


def _launch_env(env: dict) -> dict:
    """The environment a launched server would have after the same imports: ``env``, then what
    the imports set or removed (vLLM 0.24's ``env_override`` sets ``TORCHINDUCTOR_COMPILE_THREADS``,
    ``PYTORCH_NVML_BASED_CUDA_CHECK`` and more when it is imported); a variable the zygote started
    without and the launch sets (the GPU lease) keeps the launch's value."""
    out = dict(env)
    for k, v in _IMPORTED_ENV.items():
        if k not in _START_ENV and k in env:
            continue
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def _child(req: dict, run: object, fds: tuple[int, ...]) -> None:
    """In the forked child: become the server, then run ENTRY and exit as a Python program does
    (``SystemExit`` up through the zygote's frames: the interpreter's shutdown and ``atexit``
    handlers run, as for a server started afresh). Never returns."""
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})  # blocked around the fork
        os.setsid()
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a fresh interpreter
        for sig in (signal.SIGTERM, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        for fd in (log, null, *fds):
            os.close(fd)
        if req.get("cpus"):  # before anything it starts: its children inherit the cores
            os.sched_setaffinity(0, req["cpus"])
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(_launch_env(req["env"]))
        sys.argv = list(req["argv"])
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    sys.exit(run())  # type: ignore[operator]


def main(argv: list[str]) -> int:
    global _OUT
    if not argv:
        sys.stderr.write("usage: zygote.py ENTRY [MODULE ...]\n")
        return 2
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or ".") == here:
        del sys.path[0]  # the tuner's engine modules must not shadow top-level ones
    _OUT = os.dup(1)
    os.dup2(2, 1)  # the imports' prints go to stderr, never into the protocol
    t0 = time.monotonic()
    _START_ENV.update(os.environ)
    failed = []
    try:
        run = _load(argv[0])
    except Exception as exc:
        _send({"error": f"cannot load {argv[0]}: {type(exc).__name__}: {exc}"})
        return 1
    for module in argv[1:]:
        try:
            importlib.import_module(module)
        except Exception as exc:  # the child imports it again and fails as a launch would
            failed.append(f"{module}: {type(exc).__name__}: {exc}")
    _IMPORTED_ENV.update({k: v for k, v in os.environ.items() if _START_ENV.get(k) != v})
    _IMPORTED_ENV.update({k: None for k in _START_ENV if k not in os.environ})
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_initialized():
        _send({"error": "the preloaded modules initialised CUDA: a forked server could not use it"})
        return 1
    signal.signal(signal.SIGCHLD, _reap)
    _send({"ready": os.getpid(), "import_s": round(time.monotonic() - t0, 3), "failed": failed})
    for line in sys.stdin:
        try:
            req = json.loads(line)
        except ValueError as exc:
            _send({"error": f"{type(exc).__name__}: {exc}"})
            continue
        sys.stdout.flush()  # nothing buffered here may reach the child's log
        sys.stderr.flush()
        # no exit is reported (or reaped) before its pid is known and sent
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
        settled_r, settled_w = os.pipe()  # the child closes its end once it leads its group
        try:
            pid = os.fork()
        except OSError as exc:
            os.close(settled_r)
            os.close(settled_w)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
            _send({"error": f"{type(exc).__name__}: {exc}"})
            continue
        if pid == 0:
            os.close(settled_r)
            _child(req, run, (_OUT, settled_w))
        os.close(settled_w)
        os.read(settled_r, 1)  # EOF: its own session and group (or it died): stoppable by group
        os.close(settled_r)
        _CHILDREN.add(pid)
        _send({"pid": pid})
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
    # stdin closed: the tuner ended, or died (kill -9); a server it did not stop dies with it
    for pid in list(_CHILDREN):
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
