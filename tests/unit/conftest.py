"""Loopback HTTP servers for the unit tests: ``serve_app`` for any aiohttp app, and the fake vLLM
server the replay tests share (``tests/helpers/fake_vllm.py``).

The unit tests that take seconds each (``SLOW``) are marked ``slow``: the fast tier
(``pytest -m "not slow"``) leaves them out, the whole suite runs them. ``BROWSER`` names the
tests that open pages in headless Chromium (marked ``browser``)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from helpers.fake_engine import trial_factory
from helpers.fake_vllm import FakeVLLM

# module -> its slow tests ("*": all of them); seconds measured on 2 cores beside other jobs
# (docs/development.md, "Test tiers")
SLOW: dict[str, set[str]] = {
    # the simulator against the H200 measurements: 75 s in all
    "test_sim_calibration.py": {"*"},
    "test_sim_fp8_weights_bench.py": {"test_the_kept_constant_fits_better_than_weight_bytes_alone"},
    # the dry-run plan builds the workload's requests (tokenizing them), twice with auto client
    # processes: 3-13 s each
    "test_plan.py": {"*"},
    "test_client_choice.py": {
        "test_dry_run_says_what_auto_chose_and_why",
        "test_dry_run_of_a_fixed_count",
    },
    "test_container.py": {"test_the_dry_run_shows_the_docker_run"},
    # benchmarks and scripts run as subprocesses, whole simulated sweeps
    "test_landscape.py": {"test_sample_efficiency_quick_writes_json"},
    "test_sim_sweep.py": {"test_every_config_and_seed_is_a_row", "test_bad_input_is_one_line"},
    "test_replay_vs_bench_parts.py": {"test_server_queue_samples_running_requests"},
    "test_storage.py": {"test_a_study_measured_on_one_engine_is_not_continued_on_another"},
    "test_vl_model.py": {"test_prompt_tokens_are_what_vllm_counts_for_image_heavy"},
    "test_prescreen.py": {"test_picks_are_feasible_distinct_worst_of_two_streams_and_best_first"},
    "test_workload.py": {"test_trace_profile_statistics"},
}
BROWSER: dict[str, set[str]] = {"test_plots.py": {"test_figures_draw_in_a_browser_without_network"}}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for marks in (SLOW, BROWSER):
        for module, names in marks.items():
            source = (here / module).read_text()
            stale = [n for n in names if n != "*" and f"def {n}(" not in source]
            if stale:  # a renamed test: its mark would be lost without a word
                raise pytest.UsageError(f"tests/unit/conftest.py: no {stale} in {module}")
    for item in items:
        if item.path.parent != here:
            continue
        name = getattr(item, "originalname", item.name)
        for marks, mark in ((SLOW, pytest.mark.slow), (BROWSER, pytest.mark.browser)):
            listed = marks.get(item.path.name, set())
            if "*" in listed or name in listed:
                item.add_marker(mark)


@contextlib.asynccontextmanager
async def _serve(app: web.Application) -> AsyncIterator[str]:
    srv = TestServer(app, host="127.0.0.1", port=0)
    await srv.start_server()
    try:
        yield str(srv.make_url("")).rstrip("/")
    finally:
        await srv.close()


@pytest.fixture
def serve_app() -> Callable[[web.Application], AbstractAsyncContextManager[str]]:
    """``async with serve_app(app) as base_url``: ``app`` on a free loopback port."""
    return _serve


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, FakeVLLM]]:
    fake = FakeVLLM()
    app = web.Application()
    app.router.add_post("/v1/completions", fake.handle)
    app.router.add_post("/v1/chat/completions", fake.handle)
    async with _serve(app) as base:
        yield base, fake


@pytest.fixture
def trial(make_cfg: Callable[..., Any], tmp_path: Path, serve_app: Any) -> Any:
    """``async with trial(fake, *overrides, **launcher) as (ctx, launcher)``: a trial context
    whose servers are ``fake``, served in this process (``tests/helpers/fake_engine.py``)."""
    return trial_factory(make_cfg, tmp_path, serve_app)
