"""A simulated ``vllm serve`` 0.24 for CI: same CLI, log lines, refusals, HTTP API and metrics.

Run as ``python -m tuner.sim serve MODEL_DIR [vLLM flags]``. Modules: :mod:`.cli` (argument
parsing), :mod:`.startup` (config checks and refusals), :mod:`.engine` (scheduler and speed
model), :mod:`.runtime` (asyncio step loop and metrics), :mod:`.server` (process and HTTP),
:mod:`.logs` (vLLM's log format). Memory decisions come from :mod:`tuner.memory`.

Environment knobs (sim only): ``TUNER_SIM_GPU``, ``TUNER_SIM_GPU_MEMORY_GIB``,
``CUDA_VISIBLE_DEVICES`` (GPU count), ``TUNER_SIM_USED_GIB``, ``TUNER_SIM_SPEEDUP``,
``TUNER_SIM_STREAM_MS`` (:mod:`.runtime`), ``TUNER_SIM_STARTUP_S``, ``TUNER_SIM_DIE_AFTER_S``,
``TUNER_SIM_HANG``, ``TUNER_SIM_STALL`` (``N:S``: the host stops the server for S seconds at
the N-th request; several comma-separated).
"""

IMAGES_BLIND_SPOT = (
    "the simulator has no vision encoder (an image costs only its prompt tokens): on image_heavy "
    "it predicted fp8 weights +31.6 % where an H100 measured +0.6 %, 2 + 2 servers "
    "(docs/sim-calibration.md)"
)
"""Where the simulator is known wrong for requests with images, told by the prescreen
(:data:`tuner.prescreen.IMAGES_NOTE`) and under a simulated screen's table
(:func:`tuner.screen_report.simulated_note`)."""
