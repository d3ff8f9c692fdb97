"""Which study a run opens: its default name, and the engine it was measured on."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from tuner.config import EngineConfig
from tuner.engine.argv import check_command
from tuner.errors import ConfigError
from tuner.screen import prepare
from tuner.space import distributions
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


def _one_trial(cfg) -> optuna.Study:
    """``cfg``'s study with one trial asked from ``cfg``'s space and told."""
    study = open_study(cfg)
    trial = study.ask(distributions(cfg.space))
    study.tell(trial, [1.0, 1.0])
    return study


def test_a_study_continued_with_other_choices_is_refused_in_one_line(make_cfg) -> None:
    """Optuna keeps a categorical's choices for a study's life: a study continued after
    ``space.params.X.choices`` changed stopped at its first ask with a traceback ("CategoricalDistribution
    does not support dynamic value space"); now it is refused when the study is opened, in one
    line, nothing stored. A range may change; a param's kind or log scale may not."""
    on = ["+workload=chat", "study.name=grown", "space.params.max_num_seqs.enabled=true"]
    stored = _one_trial(make_cfg(*on))
    other = make_cfg(*on, "space.params.block_size.choices=[16,32]")
    with pytest.raises(ConfigError) as err:
        open_study(other)
    text = str(err.value)
    assert "\n" not in text and text.startswith("study 'grown' in ")
    assert "stores block_size with choices [16, 32, 64]; this run's are [16, 32]" in text
    assert "space.params.block_size.choices=[16,32,64]" in text and "study.name" in text
    with pytest.raises(ValueError, match="dynamic value space"):  # what Optuna would say
        stored.ask(distributions(other.space))
    assert len(optuna.load_study(study_name="grown", storage=storage_url(other)).trials) == 2
    # the same choices, another order: Optuna refuses that too
    with pytest.raises(ConfigError, match=r"this run's are \[64, 32, 16\]"):
        open_study(make_cfg(*on, "space.params.block_size.choices=[64,32,16]"))
    # a categorical of None and a string: the override to keep it writes null
    quant = make_cfg(*on, "space.params.quantization.choices=[null,fp8,awq]")
    with pytest.raises(ConfigError, match=r"quantization.choices=\[null,fp8\]"):
        open_study(quant)
    # an int range that moved: Optuna asks from it, the study goes on
    wider = make_cfg(*on, "space.params.max_num_seqs.low=8", "space.params.max_num_seqs.high=512")
    assert open_study(wider).ask(distributions(wider.space)).params["max_num_seqs"] <= 512
    # another kind, or another scale: refused
    linear = make_cfg(*on, "space.params.max_num_seqs.log=false")
    with pytest.raises(ConfigError, match="stores max_num_seqs as an int range, log scale; this"):
        open_study(linear)
    # a param the study never asked (off before): nothing to compare
    open_study(make_cfg(*on, "space.params.enforce_eager.enabled=true"))


def test_a_screen_under_a_search_studys_name_is_left_to_the_screens_own_check(make_cfg) -> None:
    """mode=screen asks from the choices the study stored where they hold its levers
    (:func:`tuner.screen_resume.stored_choices`), so opening it does not compare the spaces; the
    screen's own check refuses it here (the stored choices lack the defaults, None)."""
    _one_trial(make_cfg("+workload=chat", "study.name=both", "objective=capacity"))
    cfg = make_cfg("+workload=chat", "study.name=both", "mode=screen", "screen.only=[block_32]")
    study = open_study(cfg)
    with pytest.raises(ConfigError, match=r"stores block_size with choices \[16, 32, 64\].*None"):
        prepare(study, cfg)
