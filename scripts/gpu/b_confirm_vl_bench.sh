#!/usr/bin/env bash
# Device call B (nvidia-h200-x2). GPU 0: the chat study's remaining trials, then its confirm
# stage (goodput pick and vLLM's defaults, re-measured side by side). GPU 1: image_heavy on the
# Qwen3-VL-8B-shaped model, then the tuner's client against `vllm bench serve` on one vLLM server.
set -u
source "$(dirname "$0")/common.sh"
mkdir -p $W/chat $W/vl $W/bench
(
  cd $W/chat
  N=$(remaining "${TRIALS:-12}")
  echo "chat study: $N trials to run, then confirm"
  timeout --foreground -s INT -k 40 "${LIMIT:-530}" python3 -m tuner "${CHAT_ARGS[@]}" \
    'engine.gpus=[0]' study.n_workers=1 study.n_trials="$N"
  echo "tuner rc=$?"
) > "$LOGS/chat-b.log" 2>&1 &
CHAT=$!
(
  cd $W/vl
  timeout --foreground -s INT -k 40 "${VL_LIMIT:-250}" python3 -m tuner +workload=image_heavy engine=$ENGINE \
    model=qwen3-vl-8b 'engine.gpus=[1]' study.name=image_heavy-qwen3-vl-8b study.n_trials=1 objective=throughput \
    confirm.enabled=false
  echo "tuner rc=$?"
) > "$LOGS/vl.log" 2>&1
cd "$ROOT"
CUDA_VISIBLE_DEVICES=1 VLLM_SERVER_DEV_MODE=1 timeout --foreground -s INT -k 30 "${BENCH_LIMIT:-270}" \
  python3 benchmarks/replay_vs_vllm_bench.py --one-server --reps 3 --waves 8 --min-requests 64 \
  --server-cmd "${BENCH_SERVER:-vllm serve} models/qwen3-8b-dummy --load-format dummy --served-model-name m --host {host} --port {port}" \
  --workdir $W/bench --out $W/bench/replay_vs_vllm_bench-h200.json > "$LOGS/bench.log" 2>&1
echo "bench rc=$?" >> "$LOGS/bench.log"
wait $CHAT
nvidia-smi --query-gpu=index,memory.used --format=csv > "$LOGS/nvidia-smi-b.txt" 2>&1
pack b logs chat vl bench
for f in chat-b vl bench; do tail -n 4 "$LOGS/$f.log"; done
