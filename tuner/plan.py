"""``dry_run=true``: show what a study would do, launch nothing."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from tuner.config import TunerConfig
from tuner.engine.argv import build_argv, mask_argv, secret_values
from tuner.space import defaults, distributions

__all__ = ["print_plan"]


def print_plan(cfg: TunerConfig, console: Console | None = None) -> None:
    from tuner.study import study_name

    console = console or Console()
    console.print(f"study {study_name(cfg)} · engine {cfg.engine.kind} · model {cfg.model.name}")
    console.print(f"workload {cfg.workload.name}: {cfg.workload.num_requests} requests")
    for name, dist in distributions(cfg.space).items():
        console.print(f"  {name}: {dist}")
    argv = build_argv(
        cfg.engine,
        cfg.model,
        cfg.space,
        defaults(cfg.space),
        port=0,
        server_args=cfg.workload.server_args,
    )
    console.print(
        "argv with vLLM defaults: "
        + " ".join(mask_argv(argv, secret_values(cfg.engine, model=cfg.model)))
    )
    ps = cfg.study.prescreen
    if ps.trials:
        console.print(
            f"first: prescreen {ps.trials} configs on the simulator's landscape, then launch its "
            f"best {ps.top} (once per study)"
        )
    cc = cfg.confirm
    if cc.enabled and cc.picks:
        console.print(
            f"then confirm {', '.join(cc.picks)} at {cc.load_factor:g}x load, "
            f"{cc.duration_factor:g}x duration, seeds {list(cc.seeds)}; export best-<pick>.yaml"
        )
    else:
        console.print(f"then export best-<pick>.yaml for {', '.join(cc.picks) or 'no pick'}")
    console.print(f"state dir {Path(cfg.paths.state_dir).resolve()}")
