"""Servers in a container (``engine.container``, ``engine=docker``).

A trial's server is ``docker run`` in the foreground: its log streams to ``server.log`` as a
process's does, and the container's id lands in ``container.id`` (``--cidfile``). Killing the
``docker`` CLI's process group does not stop a container, so :class:`ContainerServer` stops it by
id (``docker stop -t <engine.stop_timeout_s>``, then ``docker rm -f``) before the group is ended
as usual. A registry of started containers is removed on interpreter exit and on Ctrl-C/SIGTERM.

The container gets the leased GPUs (``--gpus "device=0,1"``, numbered from 0 inside), the host's
network (the server binds loopback as ever) and IPC namespace, the model dir (read-only), the
compile cache (``VLLM_CACHE_ROOT``) and the HF cache at their own paths, and the server's
environment by name only (``-e NAME``: docker reads each value from its own environment, so no
value, a secret least of all, is ever in argv).

Each container carries the label ``tuner.lease=<lease id>`` (:data:`LEASE_LABEL`): a tuner killed
with ``kill -9`` leaves its container running (the CLI may die, the container does not), and its
processes, root's, are not found through ``/proc`` by a tuner that is not root; the next run's
crash recovery (:mod:`tuner.recovery`) removes them by that label and by the cidfile
(:func:`remove_leftovers`).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import re
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tuner.config import ContainerConfig, EngineConfig
from tuner.engine.process import Server
from tuner.errors import ConfigError
from tuner.records import LaunchInfo

__all__ = [
    "CIDFILE",
    "LEASE_LABEL",
    "SERVER_VARS",
    "ContainerServer",
    "check_image",
    "container_env",
    "container_server",
    "container_name",
    "docker_argv",
    "hf_home",
    "mounts",
    "remove_all_containers",
    "remove_leftovers",
    "wrap",
]

log = logging.getLogger(__name__)

CIDFILE = "container.id"
"""The file in the trial folder where ``docker run --cidfile`` writes the container's id."""

LEASE_LABEL = "tuner.lease"
"""The label naming the lease (``TUNER_LEASE``) of the trial a container serves."""

SERVER_VARS = (
    "VLLM_CACHE_ROOT",
    "VLLM_NO_USAGE_STATS",
    "DO_NOT_TRACK",
    "PYTHONUNBUFFERED",
    "NO_COLOR",
)
"""Variables of :func:`tuner.engine.argv.build_env` the container gets besides ``engine.env`` and
``engine.pass_env`` (``CUDA_VISIBLE_DEVICES`` is not one: ``--gpus`` numbers the lease from 0;
``HF_HOME`` only when the HF cache is mounted)."""

CLI_TIMEOUT_S = 60.0
"""The longest a ``docker stop``/``rm``/``image inspect`` may take beyond its own stop timeout."""

_LIVE: dict[Path, tuple[str, dict[str, str]]] = {}
"""cidfile -> (container CLI, its environment) of each started container not yet removed."""


def container_name(study: str, number: int, port: int) -> str:
    """``tuner-<study>-<trial>-<port>``, in the characters docker allows (the port keeps two
    servers of one trial number apart, e.g. a confirm round beside a search trial)."""
    return re.sub(r"[^a-zA-Z0-9_.-]", "-", f"tuner-{study}-{number}-{port}")


def hf_home(environ: Mapping[str, str]) -> Path:
    """The HF cache folder as huggingface_hub finds it: ``HF_HOME``, else
    ``$XDG_CACHE_HOME/huggingface``, else ``~/.cache/huggingface``."""
    if environ.get("HF_HOME"):
        return Path(environ["HF_HOME"])
    cache = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "huggingface"


def mounts(
    box: ContainerConfig, model_path: str, cache_root: Path | None, hf_cache: Path | None
) -> list[str]:
    """``-v`` specs: the model dir read-only, the compile cache and the HF cache read-write,
    each at its own absolute path, then ``engine.container.mounts``."""
    out = []
    model = Path(model_path).absolute()
    if model.is_dir():
        out.append(f"{model}:{model}:ro")
    for rw in (cache_root, hf_cache):
        if rw is not None:
            out.append(f"{rw.absolute()}:{rw.absolute()}")
    return out + list(box.mounts)


def container_env(
    engine: EngineConfig,
    env: Mapping[str, str],
    *,
    cache_root: Path | None,
    hf_cache: Path | None,
    extra: Iterable[str] = (),
) -> tuple[dict[str, str], list[str]]:
    """The docker CLI's environment (``env`` with the mounted paths made absolute) and the names
    it passes into the container: ``engine.env``, the set ``engine.pass_env``,
    :data:`SERVER_VARS`, ``HF_HOME`` with ``hf_cache``, and ``extra``."""
    env = dict(env)
    if cache_root is not None:
        env["VLLM_CACHE_ROOT"] = str(cache_root.absolute())
    wanted = [*engine.env, *engine.pass_env, *SERVER_VARS, *extra]
    if hf_cache is not None:
        env["HF_HOME"] = str(hf_cache.absolute())
        wanted.append("HF_HOME")
    return env, [k for k in dict.fromkeys(wanted) if k in env]


def docker_argv(
    engine: EngineConfig,
    argv: Sequence[str],
    *,
    gpus: Sequence[int | str],
    env_names: Iterable[str],
    volumes: Iterable[str],
    cidfile: Path | str,
    name: str,
    labels: Mapping[str, str] | None = None,
) -> list[str]:
    """``argv`` (``engine.command``, the model and its flags, as for a process) as a foreground
    ``docker run``: ``engine.command[0]`` becomes ``--entrypoint``, the rest follows the image."""
    box = engine.container
    assert box is not None
    words = list(argv[len(engine.command) :])  # the model and the flags
    out = [box.program, "run", "--cidfile", str(cidfile), "--name", name, "--pull", "never"]
    out += ["--gpus", '"device=' + ",".join(str(g) for g in gpus) + '"']
    out += ["--network", "host", "--ipc", "host", "--workdir", str(Path.cwd())]
    for k, v in (labels or {}).items():
        out += ["--label", f"{k}={v}"]
    for k in env_names:
        out += ["-e", k]
    for v in volumes:
        out += ["-v", v]
    out += ["--entrypoint", engine.command[0], *box.args, box.image]
    return out + list(engine.command[1:]) + words


def wrap(
    engine: EngineConfig,
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    model_path: str,
    cache_root: Path | None,
    gpus: Sequence[int | str],
    cidfile: Path | str,
    name: str,
    extra_env: Iterable[str] = (),
    labels: Mapping[str, str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """A server's argv and environment (as for a process) as a ``docker run``: its argv
    (:func:`docker_argv`) and the CLI's environment (:func:`container_env`). The HF cache is
    mounted when its folder exists."""
    assert engine.container is not None
    hf = hf_home(env)
    hf_cache = hf if hf.is_dir() else None
    env, names = container_env(
        engine, env, cache_root=cache_root, hf_cache=hf_cache, extra=extra_env
    )
    volumes = mounts(engine.container, model_path, cache_root, hf_cache)
    out = docker_argv(
        engine,
        argv,
        gpus=gpus,
        env_names=names,
        volumes=volumes,
        cidfile=cidfile,
        name=name,
        labels=labels,
    )
    return out, env


def check_image(engine: EngineConfig, environ: Mapping[str, str] | None = None) -> None:
    """Raise :class:`ConfigError` unless the container CLI answers and has ``image`` (trials run
    with ``--pull never``: a pull of many GiB must not eat a trial's start-up timeout)."""
    box = engine.container
    if box is None:
        return
    cmd = [box.program, "image", "inspect", "--format", "{{.Id}}", box.image]
    try:
        p = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT_S,
            env=dict(os.environ if environ is None else environ),
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        raise ConfigError(f"`{' '.join(cmd)}` did not answer in {CLI_TIMEOUT_S:.0f} s") from exc
    except OSError as exc:
        raise ConfigError(f"cannot run {box.program!r}: {exc.strerror}") from exc
    if p.returncode == 0:
        return
    why = _last_line(p) or f"exit code {p.returncode}"
    if "no such image" in why.lower():
        raise ConfigError(
            f"engine.container.image {box.image!r} is not on this machine ({why}): "
            f"run `{box.program} pull {box.image}` first; trials never pull"
        )
    raise ConfigError(f"`{box.program} image inspect {box.image}` failed: {why}")


def _last_line(p: subprocess.CompletedProcess[str]) -> str:
    """The CLI's last line on stderr (its error), else on stdout."""
    for text in (p.stderr, p.stdout):
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        if lines:
            return lines[-1]
    return ""


def _cli_run(argv: Sequence[str], timeout: float, env: Mapping[str, str]) -> tuple[int, str, str]:
    """Run a container CLI command: its exit status (-1 if it could not run or timed out), its
    stdout and its last output line."""
    try:
        p = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=dict(env),
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return -1, "", str(exc)
    return p.returncode, p.stdout, _last_line(p)


def _cli(argv: Sequence[str], timeout: float, env: Mapping[str, str]) -> tuple[int, str]:
    """Run a container CLI command; its exit status and last output line (-1 if it could not
    run or timed out)."""
    code, _, last = _cli_run(argv, timeout, env)
    return code, last


def _read_id(cidfile: Path) -> str | None:
    try:
        return cidfile.read_text().strip() or None
    except OSError:
        return None


def _remove(program: str, cid: str, stop_timeout_s: float | None, env: Mapping[str, str]) -> bool:
    """``docker stop -t`` (when ``stop_timeout_s`` is given) then ``docker rm -f``: True if the
    container is gone."""
    if stop_timeout_s is not None:
        t = max(0, round(stop_timeout_s))
        code, out = _cli([program, "stop", "-t", str(t), cid], t + CLI_TIMEOUT_S, env)
        if code != 0:
            log.warning("`%s stop %s` failed: %s", program, cid[:12], out)
    code, out = _cli([program, "rm", "-f", cid], CLI_TIMEOUT_S, env)
    if code != 0 and "no such container" not in out.lower():
        log.error("container %s was not removed: %s", cid[:12], out)
        return False
    return True


def remove_all_containers() -> None:
    """``docker rm -f`` every container this tuner started and has not removed (exit path)."""
    for cidfile, (program, env) in list(_LIVE.items()):
        cid = _read_id(cidfile)
        if cid is not None:
            _remove(program, cid, None, env)
        _LIVE.pop(cidfile, None)


atexit.register(remove_all_containers)


def remove_leftovers(program: str, lease_id: str, cidfile: Path | None) -> list[str]:
    """Crash recovery: ``docker rm -f`` every container, running or not, labelled with the lease
    ``lease_id`` (``docker ps -aq --filter label=tuner.lease=<id>``) and the one whose id is in
    ``cidfile``; the ids removed (one already gone is not). A CLI that fails is logged, never
    raised."""
    env = dict(os.environ)
    flt = f"label={LEASE_LABEL}={lease_id}"
    ps = [program, "ps", "-aq", "--no-trunc", "--filter", flt]
    code, out, last = _cli_run(ps, CLI_TIMEOUT_S, env)
    ids = out.split() if code == 0 else []
    if code != 0:
        log.warning("`%s ps --filter %s` failed: %s", program, flt, last)
    cid = _read_id(cidfile) if cidfile is not None else None
    if cid is not None and not any(cid.startswith(i) or i.startswith(cid) for i in ids):
        ids.append(cid)
    if not ids:
        return []
    code, out, last = _cli_run([program, "rm", "-f", *ids], CLI_TIMEOUT_S, env)
    if code != 0 and "no such container" not in last.lower():
        log.error("leftover container(s) %s not removed: %s", [i[:12] for i in ids], last)
    removed = set(out.split())  # docker prints each id it removed
    return [i for i in ids if i in removed]


class ContainerServer(Server):
    """A :class:`~tuner.engine.process.Server` whose argv is a foreground ``docker run
    --cidfile``; stopping it stops and removes the container by id first."""

    def __init__(self, argv: Sequence[str], *, program: str, cidfile: Path, **kw: Any) -> None:
        super().__init__(argv, **kw)
        self.program = program
        self.cidfile = cidfile
        self.container_id: str | None = None
        self.removed: bool | None = None
        """Whether the container was removed at stop (None: no container was created)."""

    async def start(self) -> LaunchInfo:
        self.cidfile.unlink(missing_ok=True)  # docker refuses to write over one
        _LIVE[self.cidfile] = (self.program, self.env)
        return await super().start()

    async def stop(self) -> None:
        if self.proc is None:
            return
        cid = self.container_id = _read_id(self.cidfile)
        if cid is not None:  # the CLI's group ends with the container
            grace = self.stop_timeout_s if self.ready else min(self.stop_timeout_s, 2.0)
            self.removed = await asyncio.to_thread(_remove, self.program, cid, grace, self.env)
        await super().stop()
        if cid is None and (cid := _read_id(self.cidfile)) is not None:
            # created while the CLI was being stopped
            self.container_id = cid
            self.removed = await asyncio.to_thread(_remove, self.program, cid, None, self.env)
        if self.removed is not False:
            _LIVE.pop(self.cidfile, None)


def container_server(
    engine: EngineConfig,
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    model_path: str,
    cache_root: Path | None,
    gpus: Sequence[int],
    cidfile: Path,
    name: str,
    lease_env: str,
    **where: Any,
) -> ContainerServer:
    """``engine.container``: a trial's server ``argv`` as a foreground ``docker run`` on ``gpus``
    (:func:`wrap`), its id in ``cidfile``, passed the variable ``lease_env`` of ``env`` and
    labelled :data:`LEASE_LABEL` with its value (crash recovery finds it by either); ``where``:
    the :class:`Server` arguments (log, host, port, timeouts, CPUs)."""
    assert engine.container is not None
    if cache_root is not None:  # docker would create a missing mount source owned by root
        cache_root.mkdir(parents=True, exist_ok=True)
    wrapped, wrapped_env = wrap(
        engine,
        argv,
        env,
        model_path=model_path,
        cache_root=cache_root,
        gpus=gpus,
        cidfile=cidfile,
        name=name,
        extra_env=[lease_env],
        labels={LEASE_LABEL: env[lease_env]},
    )
    log.debug("%s", " ".join(wrapped))
    return ContainerServer(
        wrapped, program=engine.container.program, cidfile=cidfile, env=wrapped_env, **where
    )
