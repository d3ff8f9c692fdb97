"""The precheck's GPU: the leased GPUs' memory from NVML (faked here), else ``engine.gpu``."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tuner import precheck as pc
from tuner.errors import FailureReason, TrialFailed
from tuner.memory import ModelShape
from tuner.telemetry.gpu import GpuMemory

ROOT = Path(__file__).resolve().parents[2]
SHAPE = ModelShape.from_dir(ROOT / "models" / "qwen3-8b-dummy")
PARAMS = {"gpu_memory_utilization": 0.92, "max_model_len": 40960}


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[int, tuple[str, float]]]:
    """NVML as the precheck sees it: ``{index: (name, total GiB)}`` (empty: no NVML)."""
    gpus: dict[int, tuple[str, float]] = {}

    def memory(indices: Sequence[int]) -> list[GpuMemory]:
        return [GpuMemory(i, 0.0, gpus[i][1], gpus[i][1], gpus[i][0]) for i in indices]

    monkeypatch.setattr(pc, "nvml_available", lambda: bool(gpus))
    monkeypatch.setattr(pc, "gpu_memory", memory)
    pc.leased_gpu.cache_clear()
    yield gpus
    pc.leased_gpu.cache_clear()


def test_nvml_gives_the_leased_gpus_memory(nvml: dict[int, tuple[str, float]]) -> None:
    nvml.update({0: ("NVIDIA H200", 140.4), 1: ("NVIDIA H200", 139.0)})
    gpu = pc.leased_gpu("vllm", "h200", (0, 1))
    assert gpu.profile is not None
    assert (gpu.profile.name, gpu.profile.total_gib, gpu.measured, gpu.note) == (
        "h200",
        139.0,  # the smallest of the lease
        True,
        None,
    )
    assert gpu.source == "GPU 1: NVIDIA H200, 139.0 GiB (NVML)"
    assert gpu.margin == (pc.MARGIN_GIB, pc.MARGIN_FRACTION)


@pytest.mark.parametrize(
    ("name", "profile"),
    [
        ("NVIDIA H100 80GB HBM3", "h100"),  # the SXM module the H100 runs had
        ("NVIDIA H100 PCIe", None),  # other H100s: less memory bandwidth, never measured
        ("NVIDIA H100 NVL", None),
        ("NVIDIA GH200 480GB", None),
        ("NVIDIA H200 NVL", "h200"),
    ],
)
def test_only_the_measured_gpus_take_their_profile(
    nvml: dict[int, tuple[str, float]], name: str, profile: str | None
) -> None:
    nvml[0] = (name, 79.65)
    gpu = pc.leased_gpu("vllm", "h200", (0,))
    assert gpu.profile is not None and gpu.profile.total_gib == 79.65  # NVML's, in every case
    assert gpu.measured is (profile is not None)
    assert gpu.profile.name == (profile or name)


def test_an_unknown_gpu_works_with_a_wider_margin(nvml: dict[int, tuple[str, float]]) -> None:
    nvml[0] = ("NVIDIA A100-SXM4-80GB", 79.25)
    gpu = pc.leased_gpu("vllm", "h200", (0,))
    assert gpu.profile is not None and gpu.profile.total_gib == 79.25
    assert not gpu.measured
    assert gpu.margin == (pc.UNMEASURED_MARGIN_GIB, pc.UNMEASURED_MARGIN_FRACTION)
    assert gpu.note is not None and "not on NVIDIA A100-SXM4-80GB" in gpu.note


def test_the_simulator_and_no_nvml_take_engine_gpu(nvml: dict[int, tuple[str, float]]) -> None:
    nvml[0] = ("NVIDIA A100-SXM4-80GB", 79.25)
    sim = pc.leased_gpu("sim", "h200", (0,))  # models engine.gpu, whatever the host has
    assert sim.profile is not None and sim.profile.total_gib == 140.4 and sim.measured
    nvml.clear()
    pc.leased_gpu.cache_clear()
    assert pc.leased_gpu("vllm", "h200", (0,)).source.startswith("engine.gpu=h200, 140.4 GiB")
    unknown = pc.leased_gpu("vllm", "b300x", (0,))
    assert unknown.profile is None and unknown.note is not None


@pytest.mark.parametrize(("name", "vetoed"), [("NVIDIA H200", True), ("NVIDIA L4", False)])
def test_the_margin_decides_a_borderline_config(
    make_cfg, nvml: dict[int, tuple[str, float]], name: str, vetoed: bool
) -> None:
    # 22 GiB: the 8B's weights fit, its 40,960-token request is short of 1.4 GiB of KV cache:
    # more than the H200's margin (0.5 GiB + 2 %), less than an unmeasured GPU's (1 GiB + 5 %)
    nvml[0] = (name, 22.0)
    cfg = make_cfg("+workload=chat", "engine=vllm")
    if vetoed:
        with pytest.raises(TrialFailed) as e:
            pc.precheck(cfg, SHAPE, PARAMS, [], baseline=True)
        assert e.value.reason is FailureReason.KV_TOO_SMALL
    else:
        verdict = pc.precheck(cfg, SHAPE, PARAMS, [], baseline=True)
        assert verdict.estimate is not None
        assert verdict.estimate.failure is FailureReason.KV_TOO_SMALL  # predicted, not vetoed
        assert verdict.estimate.budget_gib == pytest.approx(0.92 * 22.0)
