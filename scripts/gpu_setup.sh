#!/usr/bin/env bash
# On the GPU machine, in the checkout, once a stage of vLLM was copied into /tmp/stage (made by
# your own staging script, nothing else in that folder): /tmp/stage/part* in name order is one tar
# stream of wheels/ (vLLM 0.24.0 for CPython 3.12 and the dependencies the image lacks),
# bin/setup.sh (installs wheels/ into /tmp/site and touches /tmp/site/.ok) and bin/env.sh (the
# environment: /tmp/site on PYTHONPATH, VLLM_USE_FLASHINFER_SAMPLER=0 when flashinfer is not
# staged, offline HF). Unpacks and installs it and the tuner's wheels (.whl/,
# scripts/stage_gpu_wheels.sh), then `source scripts/gpu_env.sh`. Idempotent.
set -euo pipefail
if [ ! -f /tmp/site/.ok ]; then
  cat /tmp/stage/part* | tar -xf - -C /tmp/stage
  bash /tmp/stage/bin/setup.sh
fi
if [ ! -f /tmp/site/.tuner-ok ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
  touch /tmp/site/.tuner-ok
fi
