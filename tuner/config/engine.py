"""The server side of the config: ``engine`` (how a server starts, its GPUs, a container) and
``model`` (what it serves)."""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import MISSING

__all__ = ["ContainerConfig", "EngineConfig", "ModelConfig"]


@dataclass
class ContainerConfig:
    """``engine.container``: each server runs as ``docker run ... <image>``, stopped and removed
    by its container id (tuner.engine.container). ``engine.command`` is the command run inside
    the image (its first word becomes ``--entrypoint``)."""

    image: str = "vllm/vllm-openai:v0.24.0"
    """Must be on the machine already (``docker pull`` it): trials never pull."""
    program: str = "docker"
    """The container CLI (checked on ``PATH`` before the study)."""
    mounts: list[str] = field(default_factory=list)
    """More ``-v`` specs (``src:dst[:ro]``); the model dir, the compile cache and the HF cache
    are mounted at their own paths already."""
    args: list[str] = field(default_factory=list)
    """More ``docker run`` options, put before the image."""


@dataclass
class EngineConfig:
    """How a server is started. ``kind`` is ``sim`` (the simulated engine) or ``vllm``; with
    ``container`` set (``engine=docker``) the server runs in a container."""

    kind: str = "sim"
    command: list[str] = field(default_factory=lambda: ["python", "-m", "tuner.sim", "serve"])
    """argv prefix; the model path and flags follow. A leading ``python`` means this interpreter."""
    host: str = "127.0.0.1"
    startup_timeout_s: float = 900.0
    stop_timeout_s: float = 15.0
    health_interval_s: float = 0.5
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment for the server process (values starting with ``$`` are read from ours)."""
    pass_env: list[str] = field(default_factory=lambda: ["HF_TOKEN", "VLLM_API_KEY"])
    """Variables passed through from our environment if set; their values are masked everywhere."""
    gpus: list[int] = field(default_factory=lambda: [0])
    """The GPU lease: indices that become ``CUDA_VISIBLE_DEVICES``."""
    cache_root: str | None = None
    """``VLLM_CACHE_ROOT``, the compile cache every launch shares: unset → one per user
    (``<user cache dir>/tuner/vllm``) for ``kind=vllm``, none for the simulator; ``user``,
    ``state`` (``<paths.state_dir>/vllm_cache``), ``none`` (vLLM's default), or a path."""
    pin_capture_size: bool = False
    """Add ``-cc.max_cudagraph_capture_size=512`` (vLLM's cap) to every launch that sets no capture
    size, so ``max_num_seqs`` < 256 no longer changes the compile key. Off: it may change which
    batch sizes run in CUDA graphs (not measured yet)."""
    gpu_free_timeout_s: float = 120.0
    """Before a launch, wait at most this long for NVML to show the memory the trial needs."""
    extra_args: list[str] = field(default_factory=list)
    """Flags added to every launch, after the model's fixed flags."""
    gpu: str = "h200"
    """GPU profile (``h200`` or ``h100``, tuner.memory.GPU_PROFILES) for the memory model's KV
    prediction where NVML cannot say (no driver here) and for the simulator; with ``kind: vllm``
    and NVML, the leased GPUs' own memory is used (:func:`tuner.precheck.leased_gpu`)."""
    cpu_pinning: bool = False
    """Pin each server's process tree to CPU cores of its own (a fixed share per GPU of
    ``engine.gpus``), so parallel trials (``study.n_workers`` > 1) do not compete for cores, and
    the tuner (its replay client processes, telemetry) to the ``cpu_reserve`` cores left out."""
    cpu_reserve: int = 2
    """With ``cpu_pinning``: the first this many cores run the tuner and its replay client (0:
    the tuner stays unpinned). ``workload.client_processes=auto`` takes at most this many client
    processes; give it one per 32 requests in flight (8 at 256, ``tuner.replay.client_cores``)."""
    container: ContainerConfig | None = None
    """Run each server in a container (``engine=docker``); None: a process on this machine."""
    preload: bool = False
    """Fork each server from one interpreter that imported ``command``'s entry point and
    ``preload_modules`` once (:mod:`tuner.engine.preload`), instead of starting a new one: a
    launch skips the interpreter's start and those imports. Where ``command`` is no console script
    or ``python -m``, or the zygote fails, servers start as processes (the reason logged once);
    a forked server silent for ``Preload.silent_s`` is started again as one. On in
    ``conf/engine/vllm.yaml`` (measured on the H200), off in ``conf/engine/sim.yaml``."""
    preload_modules: list[str] = field(default_factory=list)
    """Imported by the zygote besides the entry point's module (one that fails is logged and
    left to the server)."""


@dataclass
class ModelConfig:
    """The model under test. ``path`` is a local directory with ``config.json`` and a tokenizer,
    or a Hugging Face repo id (``Qwen/Qwen3-8B``) whose config and tokenizer files come from the
    Hugging Face cache (:mod:`tuner.model_source`). The server gets ``path`` as it is and loads
    the weights itself (vLLM downloads a repo id's)."""

    name: str | None = None
    """Default (null): the last component of ``path`` (the repo's name), lower-cased."""
    path: str = MISSING
    served_name: str = "m"
    max_model_len: int | None = None
    """The model's own context length (vLLM's derived max_model_len). Default (null): derived
    from ``config.json`` (``text_config``'s for a vision-language model)."""
    load_format: str | None = None
    """``--load-format`` on every launch: ``dummy`` builds the model's shape with random weights
    (the shipped shapes under ``models/`` have none); null: vLLM's default, the real weights."""
    fixed_args: dict[str, Any] = field(default_factory=dict)
    """Flags passed on every launch, e.g. ``{enforce-eager: true}``."""
    local_dir: str | None = None
    """Set at load, not by hand: the local directory the tuner reads ``config.json``, the
    tokenizer and the chat template from (``path`` itself, or the repo's snapshot in the
    Hugging Face cache)."""

    @property
    def files(self) -> Path:
        """The local directory with the model's ``config.json`` and tokenizer files."""
        return Path(self.local_dir or self.path)

    @property
    def dummy_weights(self) -> bool:
        """The server builds random weights (``load_format`` or a fixed ``--load-format``
        ``dummy``): what it answers says nothing of the model's quality."""
        fixed = {k.lstrip("-").replace("-", "_"): v for k, v in self.fixed_args.items()}
        return "dummy" in (self.load_format, fixed.get("load_format"))
