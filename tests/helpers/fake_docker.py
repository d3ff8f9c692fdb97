"""A fake ``docker`` CLI for the tests of ``engine=docker`` (no Docker in CI).

The tests write it to ``<tmp>/bin/docker`` behind a ``#!<python>`` line and put that folder first
on ``PATH``. Every call appends its argv (a JSON list, without the program) to
``$FAKE_DOCKER_DIR/argv.jsonl``.

* ``run``: parses docker's options (``--cidfile``, ``-e NAME[=VALUE]``, ``--entrypoint``,
  ``--label K=V``; the GPU, network, volume and name options are recorded only), writes a fake id
  to the cidfile and starts the "container": the simulator (``python -m tuner.sim`` + the args
  after the image, which start with ``serve``) in a session of its own, with only the ``-e``
  variables (and ``PATH``, ``PYTHONPATH``), as a container would have, but for ``TUNER_LEASE``:
  a real container's processes are root's, whose ``/proc/<pid>/environ`` a tuner that is not root
  cannot read, so the tuner's crash recovery must not find the fake's by it either. It waits for
  it in the foreground, its output on ours, and exits with its status. Killing this process (or
  its group) leaves the container running, as with the real CLI: only ``stop`` and ``rm`` end
  it. ``<id>.pid`` in the state folder keeps the container's pid (also after ``rm``, which adds
  ``<id>.removed``), ``<id>.labels`` its labels (JSON).
* ``stop -t N ID``: SIGTERM the container, SIGKILL it after N s. ``rm -f ID...``: SIGKILL each,
  forget it, print its id. An unknown id fails as docker does (after the others are removed).
  An id may be a prefix of one (``ps`` without ``--no-trunc`` shows 12 characters).
* ``ps [-a] [-q] [--no-trunc] [--filter label=K=V]...``: the ids of the containers not removed
  (without ``-a``: running only) that carry every label asked for.
* ``run`` with ``FAKE_DOCKER_RUN_ERROR`` set: creates the container, then fails to start it
  (docker's exit status 125, its error line on stderr).
* ``image inspect``: succeeds, unless ``FAKE_DOCKER_IMAGES`` is set and does not name the image
  (``No such image``), or ``FAKE_DOCKER_DOWN`` is set (the daemon is down).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

STATE = Path(os.environ["FAKE_DOCKER_DIR"])
DOWN = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"
VALUED = {
    "--cidfile",
    "--name",
    "--pull",
    "--gpus",
    "--network",
    "--ipc",
    "--workdir",
    "-w",
    "-e",
    "--env",
    "-v",
    "--volume",
    "--entrypoint",
    "--shm-size",
    "--label",
    "--filter",
}
HIDDEN = ("TUNER_LEASE",)
"""Variables passed in with ``-e`` that the fake leaves out of the container's environment (see
the module's docstring)."""


def alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].split()[0] not in ("Z", "X")


def resolve(cid: str) -> str:
    """The full id of the container whose id starts with ``cid`` (``cid`` itself if none)."""
    found = [f.stem for f in STATE.glob(f"{cid}*.pid")]
    return found[0] if len(found) == 1 else cid


def pid_of(cid: str) -> int | None:
    """The container's pid; None if there is no such container (or it was removed)."""
    cid = resolve(cid)
    f = STATE / f"{cid}.pid"
    if not f.exists() or (STATE / f"{cid}.removed").exists():
        return None
    return int(f.read_text())


def options(args: list[str]) -> tuple[dict[str, list[str]], int]:
    """docker's options at the start of ``args`` (flag -> values) and where the rest starts."""
    opts: dict[str, list[str]] = {}
    i = 0
    while i < len(args) and args[i].startswith("-"):
        flag = args[i]
        if "=" in flag and flag.startswith("--"):
            flag, value = flag.split("=", 1)
            i += 1
        elif flag in VALUED:
            value = args[i + 1]
            i += 2
        else:
            value = ""
            i += 1
        opts.setdefault(flag, []).append(value)
    return opts, i


def run(args: list[str]) -> int:
    opts, i = options(args)
    image, rest = args[i], args[i + 1 :]
    cidfile = Path(opts["--cidfile"][0]) if "--cidfile" in opts else None
    if cidfile is not None and cidfile.exists():
        print(
            f"docker: Container ID file found, make sure the other container isn't running "
            f"or delete {cidfile}.",
            file=sys.stderr,
        )
        return 125
    cid = secrets.token_hex(32)
    if cidfile is not None:
        cidfile.write_text(cid)
    (STATE / f"{cid}.pid").write_text("0")  # created, not started
    labels = dict(spec.partition("=")[::2] for spec in opts.get("--label", []))
    (STATE / f"{cid}.labels").write_text(json.dumps(labels))
    if os.environ.get("FAKE_DOCKER_RUN_ERROR"):  # e.g. no GPU driver: created, never started
        print(
            f"docker: Error response from daemon: {os.environ['FAKE_DOCKER_RUN_ERROR']}",
            file=sys.stderr,
        )
        return 125
    env = {k: os.environ[k] for k in ("PATH", "PYTHONPATH") if k in os.environ}
    for spec in opts.get("-e", []) + opts.get("--env", []):
        name, sep, value = spec.partition("=")
        if sep:
            env[name] = value
        elif name in os.environ:
            env[name] = os.environ[name]
    for name in HIDDEN:
        env.pop(name, None)
    entry = opts.get("--entrypoint", ["vllm"])[0]
    if entry != "vllm":
        print(f"docker: fake image {image} has no {entry!r}", file=sys.stderr)
        return 127
    proc = subprocess.Popen(
        [sys.executable, "-m", "tuner.sim", *rest], env=env, start_new_session=True
    )
    (STATE / f"{cid}.pid").write_text(str(proc.pid))
    return proc.wait()


def stop(cid: str, timeout: float, kill_first: bool = False) -> int:
    cid = resolve(cid)
    pid = pid_of(cid)
    if pid is None:
        print(f"Error response from daemon: No such container: {cid}", file=sys.stderr)
        return 1
    if not kill_first and alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
    if alive(pid):
        # the container's every process, as docker's kill ends them (the server runs in a
        # session of its own, so its group is the container): its EngineCore child too, which
        # a SIGKILL of the server alone leaves orphaned (test_sim_server.py)
        os.killpg(pid, signal.SIGKILL)
        while alive(pid):
            time.sleep(0.05)
    print(cid)
    return 0


def ps(args: list[str]) -> int:
    opts, _ = options(args)
    wanted = [f.removeprefix("label=") for f in opts.get("--filter", []) if f.startswith("label=")]
    every = "-a" in opts or "--all" in opts or "-aq" in opts or "-qa" in opts
    for f in sorted(STATE.glob("*.pid")):
        cid = f.stem
        pid = pid_of(cid)
        if pid is None or not (every or alive(pid)):
            continue
        labels = json.loads((STATE / f"{cid}.labels").read_text())
        if all(labels.get(k) == v for k, v in (w.partition("=")[::2] for w in wanted)):
            print(cid if "--no-trunc" in opts else cid[:12])
    return 0


def rm(ids: list[str]) -> int:
    code = 0
    for cid in ids:
        cid = resolve(cid)
        if stop(cid, 0, kill_first=True) == 0:
            (STATE / f"{cid}.removed").touch()
        else:
            code = 1
    return code


def main(argv: list[str]) -> int:
    with (STATE / "argv.jsonl").open("a") as f:
        f.write(json.dumps(argv) + "\n")
    if os.environ.get("FAKE_DOCKER_DOWN"):
        print(DOWN, file=sys.stderr)
        return 1
    if argv[:2] == ["image", "inspect"]:
        image = argv[-1]
        known = os.environ.get("FAKE_DOCKER_IMAGES")
        if known is not None and image not in known.split(","):
            print("[]")
            print(f"Error response from daemon: No such image: {image}", file=sys.stderr)
            return 1
        print("sha256:" + "0" * 64)
        return 0
    if argv[:1] == ["run"]:
        return run(argv[1:])
    if argv[:1] == ["stop"]:
        t = float(argv[argv.index("-t") + 1]) if "-t" in argv else 10.0
        return stop(argv[-1], t)
    if argv[:1] == ["rm"]:
        return rm([a for a in argv[1:] if not a.startswith("-")])
    if argv[:1] == ["ps"]:
        return ps(argv[1:])
    if argv[:1] == ["inspect"]:
        return 0 if pid_of(argv[-1]) is not None else 1
    print(f"fake docker: {argv[:1]} not faked", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
