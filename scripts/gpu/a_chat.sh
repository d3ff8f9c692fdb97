#!/usr/bin/env bash
# Device call A (nvidia-h200-x2): the chat study's search, two TP=1 trials at a time on GPUs 0
# and 1; the picks are confirmed in call B. Stops itself (SIGINT) before the 10-minute call limit.
set -u
source "$(dirname "$0")/common.sh"
mkdir -p $W/chat && cd $W/chat
N=$(remaining "${TRIALS:-12}")
echo "chat study: $N trials to run"
timeout --foreground -s INT -k 40 "${LIMIT:-530}" python3 -m tuner "${CHAT_ARGS[@]}" \
  'engine.gpus=[0,1]' study.n_workers=2 study.n_trials="$N" confirm.enabled=false \
  'study.enqueue=[{gpu_memory_utilization:0.48},{gpu_memory_utilization:0.6},{enforce_eager:true},{block_size:32}]' \
  > "$LOGS/chat-a.log" 2>&1
echo "tuner rc=$?"
nvidia-smi --query-gpu=index,memory.used --format=csv > "$LOGS/nvidia-smi-a.txt" 2>&1
pack a logs chat
tail -5 "$LOGS/chat-a.log"
