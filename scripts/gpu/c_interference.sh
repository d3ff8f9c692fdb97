#!/usr/bin/env bash
# Device call C (nvidia-h200-x2): interference between two TP=1 servers (vLLM's defaults) with and
# without CPU pinning, the tuner's own replays (benchmarks/interference.py).
set -u
source "$(dirname "$0")/common.sh"
timeout --foreground -s INT -k 30 "${LIMIT:-440}" python3 benchmarks/interference.py --reps "${REPS:-3}" \
  --out "$LOGS/interference-h200x2.json" --log-dir "$LOGS/interference-servers" -- engine=$ENGINE +workload=chat 'engine.gpus=[0,1]' \
  workload.num_requests="${REQUESTS:-600}" ${C_EXTRA:-} > "$LOGS/interference.log" 2>&1
echo "rc=$?" >> "$LOGS/interference.log"
nvidia-smi --query-gpu=index,memory.used --format=csv > "$LOGS/nvidia-smi-c.txt" 2>&1
pack c logs
tail -25 "$LOGS/interference.log"
