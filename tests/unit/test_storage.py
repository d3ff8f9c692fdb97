"""Which study a run opens: its default name, and the engine it was measured on."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from tuner.config import EngineConfig
from tuner.engine.argv import check_command
from tuner.errors import ConfigError
from tuner.storage import open_study, sampler_seed, storage_url, study_name
from tuner.stored_study import engine_kind


def test_the_default_study_name_names_the_engine(make_cfg) -> None:
    assert study_name(make_cfg("+workload=chat")) == "chat-qwen3-8b-sim-capacity"
    assert study_name(make_cfg("+workload=chat", "engine=vllm")) == "chat-qwen3-8b-vllm-capacity"
    assert study_name(make_cfg("+workload=chat", "engine=vllm", "study.name=mine")) == "mine"


def test_a_study_measured_on_one_engine_is_not_continued_on_another(make_cfg) -> None:
    sim = make_cfg("+workload=chat", "study.name=shared")
    study = open_study(sim)
    assert engine_kind(study) == "sim"
    study.enqueue_trial({})  # something stored, which the refusal must leave as it was
    real = make_cfg("+workload=chat", "engine=vllm", "study.name=shared")  # named: same study
    with pytest.raises(ConfigError) as err:
        open_study(real)
    assert "study 'shared' in " in str(err.value)
    assert "was measured on engine=sim, this run is engine=vllm" in str(err.value)
    assert "\n" not in str(err.value)
    stored = optuna.load_study(study_name="shared", storage=storage_url(sim))
    assert engine_kind(stored) == "sim" and len(stored.trials) == 1
    assert open_study(sim).study_name == "shared"  # the same engine continues it
    # the default names never meet: vLLM's study is another one
    assert engine_kind(open_study(make_cfg("+workload=chat", "engine=vllm"))) == "vllm"


def test_a_study_stored_before_the_engine_was_recorded_is_continued(make_cfg) -> None:
    cfg = make_cfg("+workload=chat", "study.name=old")
    Path(cfg.paths.state_dir).mkdir(parents=True)
    optuna.create_study(
        study_name="old", storage=storage_url(cfg), directions=["maximize", "minimize"]
    )
    assert engine_kind(open_study(cfg)) == "sim"  # recorded from now on


def test_an_engine_command_not_on_path_is_one_line() -> None:
    missing = EngineConfig(kind="vllm", command=["tuner-no-such-engine", "serve"])
    with pytest.raises(ConfigError) as err:
        check_command(missing)
    assert str(err.value) == (
        "engine.command 'tuner-no-such-engine' is not found on PATH: install vLLM "
        "(pip install -e '.[vllm]') or set engine.command"
    )
    with pytest.raises(ConfigError, match="'/nonexistent/vllm' is not an executable file"):
        check_command(EngineConfig(kind="vllm", command=["/nonexistent/vllm", "serve"]))
    check_command(EngineConfig(kind="sim"))  # python -m tuner.sim: this interpreter


def test_the_seed_mixes_the_worker_in_only_on_a_shared_database(make_cfg, monkeypatch) -> None:
    import tuner.storage as storage_mod

    monkeypatch.setattr(storage_mod, "worker_id", lambda: "host-a:1")
    sqlite = make_cfg("+workload=chat", "study.seed=7")
    assert sampler_seed(sqlite, 0) == 7 and sampler_seed(sqlite, 5) == 12  # one tuner
    shared = make_cfg("+workload=chat", "study.seed=7", "study.storage=postgresql://db/optuna")
    a = sampler_seed(shared, 5)
    monkeypatch.setattr(storage_mod, "worker_id", lambda: "host-b:1")
    assert sampler_seed(shared, 5) != a  # tuners starting together draw differently
    assert sampler_seed(sqlite, 5) == 12
