"""Two workers that prepare one study at once enqueue one baseline, not two (tuner.study_lock).

The race it closes: each worker reads "no live baseline trial" and then enqueues one. Here the
read is slowed down (0.3 s) so that, without the lock, both workers read before either writes;
each worker is a thread with its own Optuna study object, as two processes would have. The same
test runs on PostgreSQL where TUNER_TEST_POSTGRES is set (CI)."""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest

import tuner.storage
from tuner.config import TunerConfig
from tuner.memory import ModelShape
from tuner.space import distributions
from tuner.storage import fill_queue, storage_url
from tuner.study_lock import prepare_lock

URLS = ["sqlite"] + (["postgresql"] if os.environ.get("TUNER_TEST_POSTGRES") else [])


@pytest.fixture(params=URLS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'optuna.db'}"
    else:
        yield os.environ["TUNER_TEST_POSTGRES"]


def _prepare_twice(
    make_cfg: Callable[..., TunerConfig], url: str, locked: bool, monkeypatch: pytest.MonkeyPatch
) -> optuna.Study:
    name = f"lock-{uuid.uuid4().hex[:8]}"
    cfg = make_cfg("+workload=chat", f"study.storage={url}", f"study.name={name}")
    optuna.create_study(study_name=name, storage=url, directions=["maximize", "minimize"])
    read = tuner.storage.baseline_trial

    def slow_read(*args: Any, **kwargs: Any) -> Any:
        found = read(*args, **kwargs)
        time.sleep(0.3)  # the other worker reads meanwhile
        return found

    monkeypatch.setattr(tuner.storage, "baseline_trial", slow_read)
    shape = ModelShape.from_dir(cfg.model.files)
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            study = optuna.load_study(study_name=name, storage=url)
            if locked:
                with prepare_lock(storage_url(cfg), name):
                    fill_queue(study, cfg, distributions(cfg.space), shape, [], 0)
            else:
                fill_queue(study, cfg, distributions(cfg.space), shape, [], 0)
        except BaseException as exc:  # noqa: BLE001  # re-raised in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    return optuna.load_study(study_name=name, storage=url)


def _baselines(study: optuna.Study) -> int:
    return sum(bool(t.user_attrs.get("baseline")) for t in study.trials)


def test_two_workers_preparing_at_once_enqueue_one_baseline(
    make_cfg: Callable[..., TunerConfig],
    url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="tuner"):
        study = _prepare_twice(make_cfg, url, locked=True, monkeypatch=monkeypatch)
    assert _baselines(study) == 1
    assert "another worker is preparing study" in caplog.text  # one waited, and said so


def test_without_the_lock_the_race_is_real(
    make_cfg: Callable[..., TunerConfig], url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the test above would pass without a race to close: here it is, with the lock left out
    study = _prepare_twice(make_cfg, url, locked=False, monkeypatch=monkeypatch)
    assert _baselines(study) == 2


def test_a_lock_is_released_when_its_block_raises(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    with pytest.raises(RuntimeError), prepare_lock(url, "s"):
        raise RuntimeError("boom")
    done = threading.Event()

    def again() -> None:
        with prepare_lock(url, "s"):
            done.set()

    t = threading.Thread(target=again)
    t.start()
    t.join(timeout=10)
    assert done.is_set()
