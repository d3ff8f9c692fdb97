# On the GPU machine: `source scripts/gpu_env.sh` (after scripts/gpu_setup.sh) to run the tuner
# from this checkout against the staged vLLM.
source /tmp/stage/bin/env.sh
export PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}"
