#!/usr/bin/env bash
# Device work (nvidia-h200), issue 30's first screen: which vLLM 0.24.0 flags move chat's SLO
# capacity. Chat at its own SLO (p95 TTFT <= 2 s, TPOT <= 50 ms), objective=capacity, one trial per
# tuner invocation so every measurement is a fresh server; each lever alone on top of vLLM's
# defaults (a fixed flag, its own study lev-NAME), vLLM's defaults first and last (study
# lev-defaults). The search starts at 256 in flight (the defaults' capacity was 285 in flight,
# docs/gpu-runs/2026-12-02-capacity-probe.md), without the incumbent probe (each lever needs its
# own capacity, not a bound). A lever runs only while time is left for it and the closing
# defaults. Then each lever against the defaults (scripts/gpu/capacity_verdict.py).
#   bash /tmp/stage/bin/bg.sh start lev bash scripts/gpu/n_levers.sh    (carry .whl), then
#   bash /tmp/stage/bin/bg.sh wait lev 540 ... ; results: $OUT/lev.tgz.part-*
# Here, on the simulator: LOCAL_TEST=1 ENGINE=sim REQS=200 CONC=16 LEVERS="kvfp8 mnbt2048" bash scripts/gpu/n_levers.sh
set -u
T="${T:-1500}"
source "$(dirname "$0")/common.sh"
mkdir -p "$W/lev" && cd "$W/lev"
ARGS=(+workload=chat "engine=$ENGINE" model=qwen3-8b "workload.arrival.concurrency=${CONC:-256}"
  "workload.num_requests=${REQS:-800}" space=none objective=capacity
  objective.capacity.incumbent_probe=false "objective.capacity.max_steps=${STEPS:-6}"
  confirm.enabled=false study.n_trials=1 ${EXTRA:-})
declare -A FLAG=(
  [fp8w]=+model.fixed_args.quantization=fp8
  [kvfp8]=+model.fixed_args.kv-cache-dtype=fp8
  [mnbt2048]=+model.fixed_args.max-num-batched-tokens=2048
  [mnbt16384]=+model.fixed_args.max-num-batched-tokens=16384
  [si8]=+model.fixed_args.stream-interval=8
  [mns128]=+model.fixed_args.max-num-seqs=128
  [block32]=+model.fixed_args.block-size=32
)
PER="${PER:-200}"  # seconds a server is planned to take (start-up, 4-6 replays, stop)
run() {  # run ARM [FLAG]
  local arm=$1; shift
  timeout --foreground -s INT -k 30 $(( T - SECONDS - 30 )) python3 -m tuner "${ARGS[@]}" \
    "study.name=lev-$arm" "$@" > "$LOGS/lev-$arm-$SECONDS.log" 2>&1
  echo "$(date -u +%T) $arm: rc=$? $(grep -ho 'SLO capacity.*' "$LOGS"/lev-"$arm"-*.log | tail -1)"
}
run defaults
done_levers=()
for lever in ${LEVERS:-fp8w kvfp8 mnbt2048 mnbt16384 si8 mns128 block32}; do
  [ $(( T - SECONDS )) -lt $(( 2 * PER )) ] && { echo "no time left for $lever"; break; }
  run "$lever" "${FLAG[$lever]}"
  done_levers+=("$lever")
done
run defaults
for lever in "${done_levers[@]}"; do
  python3 "$ROOT/scripts/gpu/capacity_verdict.py" "$W/lev/outputs/state/optuna.db" \
    "lev-$lever" lev-defaults | grep -v '^{' | tee -a "$LOGS/lev-verdict.txt"
done
nvidia-smi --query-gpu=index,memory.used --format=csv > "$LOGS/nvidia-smi-lev.txt" 2>&1
pack lev logs lev
echo "used ${SECONDS}s of $T"
