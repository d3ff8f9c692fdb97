#!/usr/bin/env bash
# Device work (nvidia-h200), issue 21's proof under the capacity objective: chat at 256 in flight
# with the tight SLO (TTFT <= 2 s and TPOT <= 25 ms at p95), objective=capacity, one trial per
# tuner invocation so every measurement is a fresh server: vLLM's defaults (space=none, study
# cap-defaults) and the same with --max-num-seqs 160 (a fixed flag, study cap-mns160),
# interleaved A B A B A B while time is left; then the gain with its interval and the verdict
# (scripts/gpu/capacity_verdict.py).
#   bash /tmp/stage/bin/bg.sh start cap bash scripts/gpu/j_capacity.sh    (carry .whl), then
#   bash /tmp/stage/bin/bg.sh wait cap 540 ... ; results: $OUT/cap.tgz.part-*
# Here, on the simulator: LOCAL_TEST=1 ENGINE=sim ROUNDS=1 REQS=60 bash scripts/gpu/j_capacity.sh
set -u
T="${T:-1500}"
source "$(dirname "$0")/common.sh"
mkdir -p "$W/cap" && cd "$W/cap"
CAP_ARGS=(+workload=chat "engine=$ENGINE" model=qwen3-8b workload.arrival.concurrency=256
  "workload.num_requests=${REQS:-300}" workload.slo.tpot_ms=25 space=none objective=capacity
  "objective.capacity.max_steps=${STEPS:-7}" confirm.enabled=false study.n_trials=1)
for r in $(seq 1 "${ROUNDS:-3}"); do
  for arm in defaults mns160; do
    [ $(( T - SECONDS )) -lt 240 ] && { echo "no time left for round $r $arm"; break 2; }
    extra=()
    [ "$arm" = mns160 ] && extra=(+model.fixed_args.max-num-seqs=160)
    timeout --foreground -s INT -k 30 $(( T - SECONDS - 60 )) python3 -m tuner "${CAP_ARGS[@]}" \
      "study.name=cap-$arm" "${extra[@]}" > "$LOGS/cap-$arm-$r.log" 2>&1
    echo "round $r $arm: rc=$? $(grep -o 'SLO capacity.*' "$LOGS/cap-$arm-$r.log" | tail -1)"
  done
done
python3 "$ROOT/scripts/gpu/capacity_verdict.py" "$W/cap/outputs/state/optuna.db" \
  cap-mns160 cap-defaults | tee "$LOGS/cap-verdict.txt"
nvidia-smi --query-gpu=index,memory.used --format=csv > "$LOGS/nvidia-smi-cap.txt" 2>&1
pack cap logs cap
echo "used ${SECONDS}s of $T"
