from __future__ import annotations

import pytest

from tuner.config import TunerConfig, available, check_override_keys, unknown_key
from tuner.errors import ConfigError


@pytest.mark.parametrize("workload", available("workload"))
@pytest.mark.parametrize("engine", ["sim", "vllm"])
def test_every_workload_composes(make_cfg, workload: str, engine: str) -> None:
    cfg = make_cfg(f"+workload={workload}", f"engine={engine}")
    assert isinstance(cfg, TunerConfig)
    assert cfg.workload.name == workload
    assert cfg.engine.kind == engine


def test_confirm_defaults_include_the_baseline_and_rounds(make_cfg) -> None:
    cc = make_cfg("+workload=chat").confirm
    assert cc.picks[-1] == "baseline" and cc.rounds == 3 and cc.min_effect == 0.03


def test_workloads_exist() -> None:
    assert {"chat", "long_docs", "image_heavy"} <= set(available("workload"))


def test_missing_workload_is_one_line(make_cfg) -> None:
    with pytest.raises(ConfigError, match=r"\+workload=NAME \(one of: .*chat"):
        make_cfg()


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("engine.host=0.0.0.0", "loopback"),
        ("study.sampler=bogus", "tpe"),
        ("objective.objectives.0.metric=speed", "output_throughput"),
        ("workload.arrival.kind=storm", "poisson"),
        ("model.path=/nonexistent", "use model=custom model.path=PATH"),
        ("study.max_rejected=-1", r"study.max_rejected is -1; allowed: an integer >= 0"),
        ("confirm.rounds=0", r"confirm.rounds is 0; allowed: an integer >= 1"),
        ("confirm.min_effect=-0.1", r"confirm.min_effect is -0.1; allowed: 0.0"),
    ],
)
def test_semantic_errors(make_cfg, override: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        make_cfg("+workload=chat", override)


@pytest.mark.parametrize("space", available("space"))
@pytest.mark.parametrize("study", available("study"))
def test_every_space_and_study_option_composes(make_cfg, space: str, study: str) -> None:
    cfg = make_cfg("+workload=chat", f"space={space}", f"study={study}", "engine.gpus=[0,1]")
    if space == "none":  # repeated measurements of vLLM's defaults
        assert cfg.space.params == {}
    elif space == "levers":  # only the flags the lever screen measured moving capacity
        assert (
            "quantization" in cfg.space.params and "gpu_memory_utilization" not in cfg.space.params
        )
    else:
        assert cfg.space.params["gpu_memory_utilization"].default == 0.92
    assert cfg.study.sampler in ("tpe", "random", "gp", "nsga2", "grid")


@pytest.mark.parametrize("objective", available("objective"))
def test_every_objective_composes(make_cfg, objective: str) -> None:
    cfg = make_cfg("+workload=chat", f"objective={objective}")
    assert cfg.objective.objectives


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [  # two mistakes: the first check in tuner.checks.CHECKS names its own
        (
            ["engine.cpu_pinning=true", "engine.cpu_reserve=999", "study.sampler=bogus"],
            "cpu_pinning",
        ),
        (["study.prescreen.top=0", "objective.objectives.0.metric=speed"], "study.prescreen"),
        (["objective.objectives.0.metric=speed", "confirm.seeds=[]"], "objective metric"),
        (["workload.client_loop=nope", "workload.arrival.kind=storm"], "workload.client_loop"),
        (
            ["model=custom", "model.path=/nonexistent", "space.params.max_num_seqs.low=0"],
            "model.path '/nonexistent' is not a directory",
        ),
    ],
)
def test_checks_run_in_order(make_cfg, overrides: list[str], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        make_cfg("+workload=chat", *overrides)


@pytest.mark.parametrize("plus", ["+", ""])
@pytest.mark.parametrize(
    ("key", "closest"),
    [
        ("study.ntrials=5", "study.n_trials"),
        ("dryrun=true", "dry_run"),
        ("workload.arrival.concurency=8", "workload.arrival.concurrency"),
        ("space.params.max_num_seqs.hi=64", "space.params.max_num_seqs.high"),
        ("objective.objectives.0.metrc=goodput", "objective.objectives.0.metric"),
    ],
)
def test_an_unknown_key_is_refused_with_the_closest(
    make_cfg, plus: str, key: str, closest: str
) -> None:
    # with "+" Hydra adds the key (a study then ran with it ignored); without, Hydra's own
    # message is several lines: both are one line naming the key and the closest known one
    name = key.partition("=")[0]
    with pytest.raises(ConfigError) as err:
        make_cfg("+workload=chat", plus + key)
    assert str(err.value) == f"unknown config key {name}; the closest known key is {closest}"


def test_free_form_keys_can_still_be_added(make_cfg) -> None:
    cfg = make_cfg(
        "+workload=chat",
        "+model.fixed_args.max-num-seqs=160",
        "+engine.env.MY_VAR=1",
        "+workload.server_args.max-log-len=10",
        "engine.extra_args=[--disable-log-requests]",
        "+space.params.cudagraph_mode.when.kv_cache_dtype=auto",
        "study.enqueue=[{max_num_seqs:64}]",
    )
    assert cfg.model.fixed_args["max-num-seqs"] == 160
    assert cfg.engine.env["MY_VAR"] == "1"
    assert cfg.workload.server_args["max-log-len"] == 10
    assert cfg.engine.extra_args == ["--disable-log-requests"]
    assert cfg.space.params["cudagraph_mode"].when == {
        "enforce_eager": False,
        "kv_cache_dtype": "auto",
    }


@pytest.mark.parametrize(
    "arg",
    ["hydra.run.dir=/tmp/x", "hydra/job_logging=disabled", "--cfg", "+workload=chat", "-m"],
)
def test_hydra_owns_its_own_overrides(arg: str) -> None:
    check_override_keys([arg])  # no error: Hydra judges these


def test_unknown_key_walks_the_schema() -> None:
    assert unknown_key(["study", "n_trials"]) is None
    assert unknown_key(["engine", "env", "ANY_NAME"]) is None  # a dict's keys are free
    assert unknown_key(["workload", "trace", "path"]) is None  # an optional section
    assert unknown_key(["workload", "trace", "pth"]) == (
        "unknown config key workload.trace.pth; the closest known key is workload.trace.path"
    )
