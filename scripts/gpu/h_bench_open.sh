#!/usr/bin/env bash
# One device call (nvidia-h200-x2) of issue #4's client comparison on both GPUs at once:
# `benchmarks/replay_vs_vllm_bench.py --one-server` against one `vllm serve` (Qwen3-8B shape,
# dummy weights, vLLM's defaults, VLLM_SERVER_DEV_MODE=1 for the prefix-cache reset) per GPU,
# pairs until the call's time is up (SIGINT: the benchmark keeps the pairs that finished).
#   GPU 0: BENCH0 (default: open loop at 24 req/s, constant gaps)
#   GPU 1: BENCH1 (default: open loop at 24 req/s, Poisson gaps on vllm's own seeded schedule)
# PIN0 / PIN1 (e.g. "0-11 12-15"): cores for GPU K's server, then for its benchmark and clients.
# SERVER, PY: the server command and the Python. Here, on the simulator: LOCAL_TEST=1 ENGINE=sim
# TUNER_VLLM_CLI=<a CPU install's vllm> with the venv active.
# T: seconds this call may use (from the script's start); TAG names this call's files.
# Results: $OUT/bench-$TAG.tgz.part-* (both JSONs, logs, vllm's per-run JSON, queue samples).
set -u
T="${T:-570}"
TAG="${TAG:-1}"
source "$(dirname "$0")/common.sh"
BENCH0="${BENCH0:---rate 24 --burstiness inf}"
BENCH1="${BENCH1:---rate 24 --burstiness 1}"
VLLM_SERVE="vllm serve models/qwen3-8b-dummy --load-format dummy --served-model-name m --host {host} --port {port}"
[ "$ENGINE" = sim ] && VLLM_SERVE="python3 -m tuner.sim serve models/qwen3-8b-dummy --load-format dummy --served-model-name m --host {host} --port {port}"
SERVER="${SERVER:-$VLLM_SERVE}"
run_bench() {  # run_bench GPU ARGS [SERVER_CORES CLIENT_CORES]: cores pin the server / the clients
  local gpu=$1 dir="$W/bench-$TAG-gpu$1" srv="$SERVER" pin=()
  mkdir -p "$dir"
  [ -n "${3:-}" ] && srv="taskset -c $3 $SERVER" && pin=(taskset -c "$4")
  # shellcheck disable=SC2086
  CUDA_VISIBLE_DEVICES=$gpu VLLM_SERVER_DEV_MODE=1 timeout --foreground -s INT -k 40 "$(( T - SECONDS - 45 ))" \
    "${pin[@]}" "${PY:-python3}" benchmarks/replay_vs_vllm_bench.py --one-server $2 --reps "${REPS:-40}" \
    --rate-duration-s "${RUN_S:-20}" --server-cmd "$srv" \
    --workdir "$dir" --out "$dir/replay_vs_vllm_bench-h200-$TAG-gpu$gpu.json" > "$dir/bench.log" 2>&1
  echo "bench gpu$gpu rc=$?" >> "$dir/bench.log"
}
run_bench 0 "$BENCH0" ${PIN0:-} &
A=$!
run_bench 1 "$BENCH1" ${PIN1:-} &
B=$!
wait $A $B
nvidia-smi > "$W/bench-$TAG-gpu0/nvidia-smi.txt" 2>&1
pack "bench-$TAG" "bench-$TAG-gpu0" "bench-$TAG-gpu1"
for g in 0 1; do echo "== gpu$g"; grep -a "rep \|pairs, mean\|rc=" "$W/bench-$TAG-gpu$g/bench.log" | tail -n 30; done
echo "call $TAG used ${SECONDS}s of $T"
