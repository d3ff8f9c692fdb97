"""``result.json`` is a :class:`TrialResult` through :func:`to_json`: its text (keys, their order,
the launch's fields beside ``startup_s``) is stored data and must not change."""

from __future__ import annotations

import textwrap

import optuna

from tuner import stored_trial
from tuner.records import LaunchInfo, LogFacts, TrialResult, rejected_before_launch, to_json

LAUNCH = LaunchInfo(
    port=8123,
    pid=4242,
    startup_s=61.5,
    facts=LogFacts(
        kv_cache_tokens=814368,
        max_concurrency=19.88,
        max_model_len=40960,
        kv_cache_gib=111.83,
        model_load_gib=15.27,
        model_load_s=4.51,
        graph_capture_s=12.0,
        graph_capture_gib=0.55,
        init_engine_s=41.2,
        compile_s=22.1,
        engine_version="0.24.0",
    ),
)

RESULT_JSON = """\
    {
      "number": 3,
      "params": {
        "max_num_seqs": 64,
        "enable_prefix_caching": true
      },
      "argv": [
        "vllm",
        "serve",
        "m",
        "--max-num-seqs",
        "64"
      ],
      "values": [
        1234.5
      ],
      "constraints": {
        "slo_ttft": -0.25
      },
      "metrics": {
        "goodput": 2.5,
        "ttft_p95_ms": 150.0
      },
      "failure_reason": null,
      "failure_detail": null,
      "launch": {
        "port": 8123,
        "pid": 4242,
        "startup_s": 61.5,
        "kv_cache_tokens": 814368,
        "max_concurrency": 19.88,
        "max_model_len": 40960,
        "kv_cache_gib": 111.83,
        "model_load_gib": 15.27,
        "model_load_s": 4.51,
        "graph_capture_s": 12.0,
        "graph_capture_gib": 0.55,
        "init_engine_s": 41.2,
        "compile_s": 22.1,
        "engine_version": "0.24.0"
      },
      "predicted_kv_tokens": 800000,
      "baseline": false,
      "duration_s": 95.0,
      "launched": true,
      "server_s": 90.25,
      "pruned": null,
      "gpus": [
        0
      ],
      "started_at": 1764470000.5,
      "machine": "GPU-5f3c0e2a"
    }
"""


def test_result_json_text_is_stable() -> None:
    r = TrialResult(
        number=3,
        params={"max_num_seqs": 64, "enable_prefix_caching": True},
        argv=("vllm", "serve", "m", "--max-num-seqs", "64"),
        values=(1234.5,),
        constraints={"slo_ttft": -0.25},
        metrics={"goodput": 2.5, "ttft_p95_ms": 150.0},
        launch=LAUNCH,
        predicted_kv_tokens=800000,
        launched=True,
        server_s=90.25,
        gpus=(0,),
        started_at=1764470000.5,
        duration_s=95.0,
        machine="GPU-5f3c0e2a",
    )
    assert to_json(r, indent=2) + "\n" == textwrap.dedent(RESULT_JSON)


def test_a_launch_whose_log_said_nothing() -> None:
    assert to_json(LaunchInfo(port=1, pid=2, startup_s=3.0)) == (
        '{"port": 1, "pid": 2, "startup_s": 3.0, "kv_cache_tokens": null, '
        '"max_concurrency": null, "max_model_len": null, "kv_cache_gib": null, '
        '"model_load_gib": null, "model_load_s": null, "graph_capture_s": null, '
        '"graph_capture_gib": null, "init_engine_s": null, "compile_s": null, '
        '"engine_version": null}'
    )


def test_a_launch_with_its_startup_phases_adds_one_key_last() -> None:
    from tuner.records import StartupFacts

    startup = StartupFacts(phases={"process": 19.0, "ready": 2.0}, compile_cache="hit")
    text = to_json(LaunchInfo(port=1, pid=2, startup_s=3.0, startup=startup))
    assert text.endswith(
        '"engine_version": null, "startup": {"phases": {"process": 19.0, "ready": 2.0}, '
        '"compile_cache": "hit", "compile_hash": null, "aot_hash": null}}'
    )


def test_rejected_before_launch_one_rule_for_a_result_and_a_stored_trial() -> None:
    assert rejected_before_launch("kv_too_small", False, ())
    assert not rejected_before_launch("gpu_busy", False, (0,))  # a GPU was leased: it waited
    assert not rejected_before_launch("crash", True, (0,))
    assert not rejected_before_launch(None, False, ())  # no failure: not refused
    assert not rejected_before_launch("interrupted", None, None)  # never said (interrupted)

    def result(**kw: object) -> TrialResult:
        return TrialResult(0, {}, (), None, {}, {}, **kw)  # type: ignore[arg-type]

    assert result(failure_reason="kv_too_small").rejected_before_launch
    assert not result().rejected_before_launch
    assert not result(failure_reason="crash", launched=True, gpus=(0,)).rejected_before_launch
    study = optuna.create_study()
    for attrs, refused in (
        ({"failure_reason": "kv_too_small", "launched": False, "gpus": []}, True),
        ({"failure_reason": None, "launched": False, "gpus": []}, False),
        ({"failure_reason": "gpu_busy", "launched": False, "gpus": [0]}, False),
        ({"failure_reason": "interrupted"}, False),
    ):
        trial = study.ask()
        for k, v in attrs.items():
            trial.set_user_attr(k, v)
        assert stored_trial.rejected_before_launch(trial) is refused, attrs
        assert stored_trial.counted(trial) is not refused
