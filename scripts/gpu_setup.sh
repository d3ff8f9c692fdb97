#!/usr/bin/env bash
# On the GPU machine, in the checkout, after the shared/device stage chunks were copied into
# /tmp/stage (shared/device/README.md): unpack and install vLLM's wheels and the tuner's (.whl/),
# then `source scripts/gpu_env.sh`. Idempotent.
set -euo pipefail
if [ ! -f /tmp/site/.ok ]; then
  cat /tmp/stage/part* | tar -xf - -C /tmp/stage
  bash /tmp/stage/bin/setup.sh
fi
if [ ! -f /tmp/site/.tuner-ok ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
  touch /tmp/site/.tuner-ok
fi
