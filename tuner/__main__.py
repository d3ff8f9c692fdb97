"""``python -m tuner +workload=chat [overrides]`` — the Hydra entry point.

``python -m tuner report study.name=NAME [overrides]`` regenerates the exports, figures and tables
of a stored study without running anything (``+workload=NAME`` instead of ``study.name`` names the
default study of that workload).

Thin: compose (Hydra) → convert to dataclasses once (:func:`tuner.checks.to_config`) →
:func:`tuner.study.run`. User mistakes become one line on stderr and exit code 2; nothing is
launched before the whole config has been checked.
"""

from __future__ import annotations

import logging
import signal
import sys
from types import FrameType

import hydra
from omegaconf import DictConfig

from tuner.checks import to_config
from tuner.config import available, conf_dir, register_schemas
from tuner.errors import ConfigError, TunerError

log = logging.getLogger("tuner")

register_schemas()

_MODE = {"report": False}


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


def _report_args(argv: list[str]) -> None:
    """``report`` names its study by ``study.name=`` or by ``+workload=`` (the default name)."""
    named = any(a.startswith("study.name=") for a in argv)
    workload = any(a.lstrip("+").startswith("workload=") for a in argv)
    if not named and not workload:
        raise ConfigError(
            "report needs the study: study.name=NAME, or +workload=NAME for its default study"
        )
    if not workload:  # the workload only names a default study; the stored study has the rest
        sys.argv.append("+workload=chat")


def _sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def _app(cfg: DictConfig) -> None:
    from tuner.study import run

    try:
        config = to_config(cfg)
        if _MODE["report"]:
            from tuner.report import run_report

            run_report(config)
            return
        if config.dry_run:
            from tuner.plan import print_plan

            print_plan(config)
            return
        run(config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except TunerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)


def main() -> None:
    signal.signal(signal.SIGTERM, _sigterm)
    try:
        if sys.argv[1:2] == ["report"]:
            del sys.argv[1]
            _MODE["report"] = True
            _report_args(sys.argv[1:])
        _check_groups(sys.argv[1:])
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    try:
        _app()
    except KeyboardInterrupt:
        from tuner.engine.process import kill_all_groups

        kill_all_groups()
        print("interrupted; stored trials are kept", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
