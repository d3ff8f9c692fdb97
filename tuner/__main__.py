"""``python -m tuner +workload=chat [overrides]`` — the Hydra entry point.

``python -m tuner report study.name=NAME [overrides]`` regenerates the exports, figures and tables
of a stored study without running anything (``+workload=NAME`` instead of ``study.name`` names the
default study of that workload on the ``engine`` given); it is its own Hydra app,
:func:`_report_app`.

Thin: compose (Hydra) → convert to dataclasses and check, once (:func:`tuner.checks.to_config`) →
:func:`tuner.study.run` (or :func:`tuner.report.run_report`). User mistakes become one line on
stderr and exit code 2; nothing is launched before the whole config has been checked, and a
command that fails before writing anything of its own leaves no run folder (Hydra makes it before
the app runs; :func:`_drop_bare_run_dir` removes it again).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

import hydra
from omegaconf import DictConfig

from tuner.config import (
    TunerConfig,
    available,
    check_override_keys,
    conf_dir,
    register_schemas,
)
from tuner.errors import ConfigError, TunerError

log = logging.getLogger("tuner")

register_schemas()


def _check_groups(argv: list[str]) -> None:
    """Reject an unknown group option (``+workload=nope``) with one line, before Hydra's
    multi-line message."""
    groups = {p.name for p in conf_dir().iterdir() if p.is_dir() and p.name != "hydra"}
    for arg in argv:
        key, sep, value = arg.lstrip("+~").partition("=")
        if not sep or key not in groups or not value or "," in value or "(" in value:
            continue
        options = available(key)
        if value not in options:
            raise ConfigError(f"unknown {key} {value!r}; allowed: {', '.join(options)}")


def _report_overrides(args: list[str]) -> list[str]:
    """``report`` names its study by ``study.name=`` or by ``+workload=`` (the default name);
    its overrides, with ``+workload=chat`` added when only the name is given."""
    named = any(a.startswith("study.name=") for a in args)
    workload = any(a.lstrip("+").startswith("workload=") for a in args)
    if not named and not workload:
        raise ConfigError(
            "report needs the study: study.name=NAME, or +workload=NAME for its default study"
        )
    if not workload:  # the workload only names a default study; the stored study has the rest
        return [*args, "+workload=chat"]
    return list(args)


def _sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


class _MaskSecrets(logging.Filter):
    """Every log line with the config's secrets masked (the API key, the storage's password),
    on the console and in the job's log file alike, whatever ``hydra.verbose`` lets through."""

    def __init__(self, secrets: list[str]) -> None:
        super().__init__()
        self.secrets = secrets

    def filter(self, record: logging.LogRecord) -> bool:
        from tuner.engine.argv import mask

        try:
            message = record.getMessage()
        except (TypeError, ValueError):
            return True
        record.msg, record.args = mask(message, self.secrets), None
        if record.exc_info and not record.exc_text:
            text = logging.Formatter().formatException(record.exc_info)
            record.exc_text = mask(text, self.secrets)
        return True


def _mask_run(secrets: list[str]) -> None:
    """Keep the secrets out of this run's files: mask Hydra's copy of the command line and
    config (``.hydra/*.yaml``, written before the app runs) and every later log line."""
    from hydra.core.hydra_config import HydraConfig

    from tuner.artifacts import mask_file

    if HydraConfig.initialized():
        hc = HydraConfig.get()
        if hc.output_subdir is not None:
            saved = Path(hc.runtime.output_dir) / str(hc.output_subdir)
            for path in saved.glob("*.yaml"):
                mask_file(path, secrets)
    masking = _MaskSecrets(secrets)
    for handler in logging.getLogger().handlers:
        handler.addFilter(masking)


def _checked(cfg: DictConfig, task: Callable[[TunerConfig], object]) -> None:
    """Convert and check ``cfg``, mask its secrets in what this run writes, then run ``task``;
    a ConfigError exits 2, any other TunerError 1, each as one line on stderr."""
    from tuner.checks import to_config  # imports every stage: after Hydra has composed
    from tuner.engine.argv import mask, secret_values

    secrets: list[str] = []
    try:
        config = to_config(cfg)
        secrets = secret_values(config.engine, model=config.model)
        _mask_run(secrets)
        task(config)
    except ConfigError as exc:
        _drop_bare_run_dir()
        print(f"error: {mask(str(exc), secrets)}", file=sys.stderr)
        sys.exit(2)
    except TunerError as exc:
        _drop_bare_run_dir()
        print(f"error: {mask(str(exc), secrets)}", file=sys.stderr)
        sys.exit(1)


def _drop_bare_run_dir() -> None:
    """Remove this invocation's run folder if it holds only what Hydra wrote before the app ran
    (its ``.hydra/`` copy of the config and the job's log): a command that failed before
    writing anything leaves no empty ``outputs/runs/<time>/`` behind, nor the empty folders
    above it up to the working directory."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return
    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir).resolve()
    hydra_own = {f"{hc.job.name}.log", str(hc.output_subdir)}
    if not run_dir.is_dir() or not all(p.name in hydra_own for p in run_dir.iterdir()):
        return
    shutil.rmtree(run_dir, ignore_errors=True)
    cwd = Path.cwd().resolve()
    for parent in run_dir.parents:
        if cwd not in parent.parents:
            break
        try:
            parent.rmdir()  # only when empty
        except OSError:
            break


def _study(config: TunerConfig) -> None:
    if config.dry_run:
        from tuner.plan import print_plan

        print_plan(config)
        return
    from tuner.study import run

    run(config)


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def _app(cfg: DictConfig) -> None:
    """``python -m tuner +workload=NAME [overrides]``: the study (or its plan, ``dry_run``)."""
    _checked(cfg, _study)


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def _report_app(cfg: DictConfig) -> None:
    """``python -m tuner report study.name=NAME [overrides]``: the stored study's report."""
    from tuner.report import run_report

    _checked(cfg, run_report)


@contextlib.contextmanager
def _hydra_args(args: list[str]) -> Iterator[None]:
    """``@hydra.main`` reads its overrides from ``sys.argv`` alone: hand it ``args`` for the one
    call (the program name stays), and give the caller's back after."""
    saved = sys.argv
    sys.argv = [saved[0], *args]
    try:
        yield
    finally:
        sys.argv = saved


def main() -> None:
    signal.signal(signal.SIGTERM, _sigterm)
    # Ctrl-C stops the tuner even when whatever started it ignored SIGINT (a script's ``nohup``
    # or ``&`` in a non-interactive shell, ``trap '' INT``): Python keeps an inherited SIG_IGN
    signal.signal(signal.SIGINT, signal.default_int_handler)
    args = sys.argv[1:]
    report = args[:1] == ["report"]
    try:
        if report:
            args = _report_overrides(args[1:])
        _check_groups(args)
        check_override_keys(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    try:
        if report:
            with _hydra_args(args):
                _report_app()
        else:
            _app()
    except KeyboardInterrupt:
        from tuner.engine.container import remove_all_containers
        from tuner.engine.process import kill_all_groups

        remove_all_containers()  # a container outlives its docker CLI's process group
        kill_all_groups()
        print("interrupted; stored trials are kept", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
