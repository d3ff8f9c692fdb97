"""The dry-run plan's estimate of how much of the space the precheck refuses."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
from rich.console import Console

from tuner.plan import print_plan, refusal_shares
from tuner.workload import load_trace

ROOT = Path(__file__).resolve().parents[2]


def test_refusal_shares_of_the_full_space(make_cfg) -> None:
    shares = refusal_shares(make_cfg("+workload=chat", "space=full"), draws=400)
    # chunked prefill off with max_num_batched_tokens < max_model_len: a large share of the
    # full space; every share is a fraction of the draws
    assert 0.1 < shares["invalid_config"] < 0.6
    assert all(0 < v <= 1 for v in shares.values())
    assert sum(shares.values()) <= 1.0
    assert shares == refusal_shares(make_cfg("+workload=chat", "space=full"), draws=400)  # seeded
    # the default space keeps no flag that reaches an infeasible corner (conf/space/default.yaml)
    assert refusal_shares(make_cfg("+workload=chat"), draws=400) == {}


def test_a_space_that_cannot_start_is_named(make_cfg) -> None:
    cfg = make_cfg(
        "+workload=chat",
        "space=full",
        "space.params.gpu_memory_utilization.low=0.10",
        "space.params.gpu_memory_utilization.high=0.11",  # not even the weights fit
        "space.params.quantization.enabled=false",  # (fp8 weights would fit)
    )
    shares = refusal_shares(cfg, draws=200)
    assert sum(shares.values()) == pytest.approx(1.0)  # vLLM's validation speaks first
    assert set(shares) == {"no_kv_memory", "invalid_config"}
    buf = io.StringIO()
    print_plan(cfg, Console(file=buf, width=300))
    out = buf.getvalue()
    assert "precheck: refuses 100% of 1000 random configs from this space (no_kv_memory" in out
    assert "note: 100% of the space cannot start; narrow space.params" in out


def test_no_estimate_without_the_precheck(make_cfg) -> None:
    buf = io.StringIO()
    print_plan(make_cfg("+workload=chat", "study.precheck=false"), Console(file=buf, width=300))
    assert "precheck: refuses" not in buf.getvalue()


def plan_text(cfg) -> str:
    buf = io.StringIO()
    print_plan(cfg, Console(file=buf, width=1000))
    return buf.getvalue()


def test_the_baseline_argv_has_no_searched_flag(make_cfg) -> None:
    # it once printed "argv with vLLM defaults" with every searched flag spelled out, while the
    # baseline trial passes none of them
    out = plan_text(make_cfg("+workload=chat", "study.precheck=false"))
    assert (
        "baseline trial (vLLM's defaults, no searched flag passed): "
        f"{sys.executable} -m tuner.sim serve {ROOT}/models/qwen3-8b-dummy --host 127.0.0.1 "
        "--port <free port> --served-model-name m --load-format dummy\n"
    ) in out
    assert (
        "searched trials: the same plus their value of --block-size --max-num-batched-tokens "
        "-cc.cudagraph_mode --kv-cache-dtype --quantization\n"
    ) in out
    assert "--block-size 16" not in out
    out = plan_text(
        make_cfg("+workload=chat", "study.precheck=false", "study.baseline_first=false")
    )
    assert "no baseline trial (study.baseline_first=false)\nevery trial: " in out
    assert "--load-format dummy plus its value of --block-size --max-num-batched-tokens" in out


def test_a_trace_is_described_as_replayed_open_loop(make_cfg) -> None:
    # it once said "32 requests in flight" (the closed loop's unused default) and the workload's
    # unused num_requests
    cfg = make_cfg("+workload=trace", "study.precheck=false")
    rows = len(load_trace(cfg.workload.trace))
    out = plan_text(cfg)
    assert f"workload trace: {rows} requests (the rows of {cfg.workload.trace.path})" in out
    assert (
        "  open loop at the trace's send times "
        "(time_scale 1), no cap on requests in flight (workload.arrival.max_concurrency)\n"
    ) in out
    assert "32 requests in flight" not in out
    out = plan_text(
        make_cfg("+workload=trace", "study.precheck=false", "workload.arrival.max_concurrency=8")
    )
    assert "(time_scale 1), at most 8 requests in flight\n" in out


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        ([], "  closed loop, 64 requests in flight\n"),
        (
            ["workload.arrival.kind=poisson", "workload.client_processes=2"],
            "open loop: poisson arrivals at 10 requests/s, no cap on requests in flight",
        ),
        (
            ["workload.arrival.kind=poisson", "workload.arrival.max_concurrency=100"],
            "open loop: poisson arrivals at 10 requests/s, at most 100 requests in flight",
        ),
    ],
)
def test_the_replay_client_line_names_its_loop(make_cfg, overrides: list[str], line: str) -> None:
    assert line in plan_text(make_cfg("+workload=chat", "study.precheck=false", *overrides))


def test_a_missing_engine_command_is_noted(make_cfg) -> None:
    cfg = make_cfg(
        "+workload=chat",
        "engine=vllm",
        "engine.command=[tuner-no-such-vllm,serve]",
        "study.precheck=false",
    )
    assert (
        "note: engine.command 'tuner-no-such-vllm' is not found on PATH: install vLLM "
        "(pip install -e '.[vllm]') or set engine.command; the study would stop there, before "
        "storing anything\n"
    ) in plan_text(cfg)


def test_the_plan_of_a_stored_screen_shows_its_continuation_and_writes_nothing(
    make_cfg, tmp_path: Path
) -> None:
    """A screen goes on over several sessions with the same command: its dry run says which
    servers this run adds to the stored study (a continued screen's order is not a new one's),
    from an in-memory copy, and neither writes the stored study nor creates a missing file."""
    import optuna

    from tuner import screen, stored_trial
    from tuner.space import distributions
    from tuner.storage import study_name

    db = tmp_path / "optuna.db"
    args = ("+workload=chat", "mode=screen", "tracking=none", f"study.storage=sqlite:///{db}")
    first = make_cfg(*args, "screen.only=[kv_fp8]")
    assert "stored:" not in plan_text(first) and not db.exists()  # a new screen: nothing made
    study = optuna.create_study(
        study_name=study_name(first), storage=f"sqlite:///{db}", directions=["maximize", "minimize"]
    )
    prepared = screen.prepare(study, first)  # D kv_fp8 D
    trial = study.ask(distributions(prepared.space))
    study.tell(trial, [60.0, 100.0])  # the defaults ran; kv_fp8 and the closing D wait
    more = make_cfg(*args, "screen.only=[kv_fp8,mnbt_2048]")
    text = plan_text(more)
    # the waiting D opens mnbt_2048's servers: no second D right after it
    assert "has 3 screen server(s); this run continues it: kv_fp8 defaults mnbt_2048 defaults" in (
        " ".join(text.split())
    )
    again = optuna.load_study(study_name=study_name(first), storage=f"sqlite:///{db}")
    assert len(again.trials) == 3  # nothing enqueued in the stored study
    assert [stored_trial.screen_arm(t) for t in again.trials] == ["defaults", "kv_fp8", "defaults"]


def test_the_plan_of_a_stored_search_says_what_it_holds_and_what_this_run_adds(
    make_cfg, tmp_path: Path
) -> None:
    """The same command continues a study: its dry run says so, with the stored trials' states,
    read only (a file that does not exist is not created)."""
    import optuna

    from tuner.storage import study_name

    db = tmp_path / "optuna.db"
    cfg = make_cfg("+workload=chat", "tracking=none", f"study.storage=sqlite:///{db}")
    assert "stored:" not in plan_text(cfg) and not db.exists()
    study = optuna.create_study(
        study_name=study_name(cfg), storage=f"sqlite:///{db}", directions=["maximize", "minimize"]
    )
    study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL))
    study.add_trial(optuna.trial.create_trial(values=[1.0, 2.0]))
    study.enqueue_trial({})
    text = " ".join(plan_text(cfg).split())
    assert (
        f"stored: study {study_name(cfg)} has 3 trial(s) (1 complete, 1 fail, 1 waiting); this "
        f"run adds up to {cfg.study.n_trials} more" in text
    )
    assert len(optuna.load_study(study_name=study_name(cfg), storage=f"sqlite:///{db}").trials) == 3
