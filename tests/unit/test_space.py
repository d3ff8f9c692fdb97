from __future__ import annotations

import optuna
import pytest

from tuner.checks import load_config
from tuner.errors import ConfigError
from tuner.space import defaults, defaults_outside, distributions


def test_default_space_distributions(make_cfg) -> None:
    cfg = make_cfg("+workload=chat")
    d = distributions(cfg.space)
    # the flags that moved SLO capacity on some profile, and those long_docs has yet to be
    # measured on as capacity (conf/space/default.yaml says why each is in or out)
    assert set(d) == {
        "block_size",
        "max_num_batched_tokens",
        "cudagraph_mode",
        "kv_cache_dtype",
        "quantization",
    }
    full = distributions(make_cfg("+workload=chat", "space=full").space)
    assert set(d) < set(full)
    assert isinstance(full["gpu_memory_utilization"], optuna.distributions.FloatDistribution)
    assert isinstance(full["max_num_seqs"], optuna.distributions.IntDistribution)
    assert full["max_num_seqs"].log
    assert full["enforce_eager"].choices == (False, True)
    assert full["enable_prefix_caching"].choices == (False, True)
    assert 40960 in full["max_model_len"].choices  # the model's own length, by interpolation
    for space, dists in ((cfg.space, d), (make_cfg("+workload=chat", "space=full").space, full)):
        base = defaults(space)
        assert set(base) == set(dists)
        for name, value in base.items():  # the baseline must be inside the space
            assert dists[name]._contains(dists[name].to_internal_repr(value)), name
    assert defaults(make_cfg("+workload=chat", "space=full").space)["max_model_len"] == 40960


def test_the_levers_space_searches_the_screens_measured_values(make_cfg) -> None:
    # space=levers searches together the flags the screen measured moving capacity: each choice
    # but null (the flag left out) is the value of a screen lever of the same param, so a search
    # there passes the flags the screen measured, and vLLM's defaults are inside it
    cfg = make_cfg("+workload=chat", "space=levers")
    d = distributions(cfg.space)
    assert set(d) == {"quantization", "stream_interval", "disable_cascade_attn"}
    measured = {(lv.param, lv.value) for lv in cfg.screen.levers.values()}
    for name, spec in cfg.space.params.items():
        assert spec.choices is not None and spec.choices[0] is None and spec.default is None
        assert all((name, v) in measured for v in spec.choices[1:]), name
    assert defaults(cfg.space) == dict.fromkeys(d)


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("space.params.gpu_memory_utilization.high=1.5", "0 < x <= 1"),
        ("space.params.gpu_memory_utilization.low=0.0", "0 < x <= 1"),
        ("space.params.max_num_seqs.low=0", "integer >= 1"),
        ("space.params.kv_cache_dtype.choices=[auto,fp7]", "fp8"),
        ("space.params.cudagraph_mode.choices=[FULL,SOMETIMES]", "PIECEWISE"),
        ("space.params.max_model_len.choices=[4096,99999]", "<= 40960"),
        ("space.params.block_size.type=normal", "float, int, categorical, bool"),
    ],
)
def test_out_of_range_fails_with_one_line(make_cfg, override: str, needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        make_cfg("+workload=chat", override)
    msg = str(e.value)
    assert needle in msg
    assert "\n" not in msg


def test_defaults_outside_a_narrowed_range(make_cfg) -> None:
    cfg = make_cfg("+workload=chat", "space=full", "space.params.gpu_memory_utilization.high=0.5")
    assert defaults_outside(cfg.space) == ["gpu_memory_utilization"]
    assert defaults_outside(make_cfg("+workload=chat").space) == []
    assert defaults_outside(make_cfg("+workload=chat", "space=full").space) == []


def test_unknown_key_fails_at_compose(tmp_path) -> None:
    with pytest.raises(ConfigError, match="nope"):
        load_config(
            [
                "+workload=chat",
                "engine.nope=1",
                f"paths.output_dir={tmp_path}",
                f"paths.state_dir={tmp_path}",
            ]
        )
    with pytest.raises(ConfigError):
        load_config(
            [
                "+workload=chat",
                "study.n_trials=many",
                f"paths.output_dir={tmp_path}",
                f"paths.state_dir={tmp_path}",
            ]
        )


def test_grid_values(make_cfg) -> None:
    from tuner.space import grid

    g = grid(make_cfg("+workload=chat", "study=grid").space)
    assert "gpu_memory_utilization" not in g and "enforce_eager" not in g
    assert g["block_size"] == [16, 32, 64]
    full = grid(make_cfg("+workload=chat", "study=grid", "space=full").space)
    assert full["gpu_memory_utilization"] == [0.5, 0.7, 0.85, 0.92, 0.95]
    assert full["enforce_eager"] == [False, True]
    with pytest.raises(ConfigError, match="gpu_memory_utilization.grid"):
        grid(
            make_cfg(
                "+workload=chat", "space=full", "space.params.gpu_memory_utilization.grid=null"
            ).space
        )
