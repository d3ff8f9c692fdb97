#!/usr/bin/env bash
# Device work (nvidia-h200), issue #29 item 7's start-up: does a launch get cheaper with
# engine.preload (each server forked from one interpreter that imported vLLM's CLI) and
# VLLM_WORKER_MULTIPROC_METHOD=fork (vLLM forks its EngineCore instead of the CLI's spawn, which
# imports vLLM and torch again), and does a server started so serve the same capacity? Both are
# the engine's defaults since the capacity study of docs/gpu-runs/2026-12-05-capacity-study-fork.md;
# what that left is step 2: plain and forked capacity on one machine.
# 1. benchmarks/startup.py on vLLM's defaults: a cold launch, one warm plain launch not compared
#    (the first warm launch on a cache spent 18-19 s in warmup against 1 s later, on the H200 on
#    2026-12-02 and most likely on the H100: docs/gpu-runs/2026-12-05-fast-start-h100.md), the
#    zygotes started (untimed), then
#    REPEAT rounds of each of LAUNCHERS (plain, preload, fork, preload_fork) on that cache,
#    interleaved: ready time and phases per launcher, each as a ratio to plain's (REPEAT=1: 6
#    launches, about 8 minutes at 50-155 s a launch).
# 2. vLLM's defaults' chat SLO capacity (its own SLO, from 256 in flight, 800 requests, incumbent
#    probe off), one tuner invocation per server, arms plain (neither lever) and fast (both, the
#    engine's defaults) interleaved
#    P F P F while time is left; then the change with its interval and the verdict
#    (scripts/gpu/capacity_verdict.py). Each invocation starts its own zygote, so these servers'
#    ready times include its imports: step 1 measures the saving, step 2 the capacity.
# 3. If time is left, one cold launch of the defaults with VLLM_LOGGING_LEVEL=DEBUG (its log kept).
#   bash /tmp/stage/bin/bg.sh start fs env T=1500 bash $PWD/scripts/gpu/r_fast_start.sh   (carry .whl)
#   then bash /tmp/stage/bin/bg.sh wait fs 520; bash scripts/gpu/r_fast_start.sh keep   (each call),
#   finally bash scripts/gpu/r_fast_start.sh pack: $OUT/fs.tgz.part-*
# Here, on the simulator: LOCAL_TEST=1 ENGINE=sim REPEAT=1 ROUNDS=1 REQS=60 CONC=8 T=600 bash scripts/gpu/r_fast_start.sh
set -u
T="${T:-1500}"
source "$(dirname "$0")/common.sh"
case "${1:-run}" in
  keep) cp "$LOGS"/fs-*.log "$LOGS"/bench.log "$OUT"/ 2>/dev/null
        grep -h "ready\|SLO capacity" "$LOGS"/bench.log "$LOGS"/fs-*.log 2>/dev/null | cut -c1-200 | tail -20
        exit 0 ;;
  pack) nvidia-smi --query-gpu=index,memory.used --format=csv > "$LOGS/nvidia-smi-fs.txt" 2>&1
        pack fs logs fs bench; exit 0 ;;
esac
mkdir -p "$W/fs" "$W/bench"
timeout --foreground -s INT -k 30 $(( T - SECONDS - 60 )) python3 benchmarks/startup.py --engine "$ENGINE" \
  --configs defaults --passes cold,warm,launchers --launchers "${LAUNCHERS:-plain,preload,fork,preload_fork}" \
  --repeat "${REPEAT:-1}" --hold-s "${HOLD:-5}" --out "$W/bench/startup-launchers.json" \
  --logs "$W/bench/servers" > "$LOGS/bench.log" 2>&1
echo "$(date -u +%T) bench: rc=$?"
tail -6 "$LOGS/bench.log"
cd "$W/fs"
# shellcheck disable=SC2086  # EXTRA: overrides, split on spaces
ARGS=(+workload=chat "engine=$ENGINE" model=qwen3-8b space=none objective=capacity
  "workload.arrival.concurrency=${CONC:-256}" "workload.num_requests=${REQS:-800}"
  "objective.capacity.max_steps=${STEPS:-6}" objective.capacity.incumbent_probe=false
  confirm.enabled=false study.n_trials=1 ${EXTRA:-})
PER="${PER:-240}"  # seconds a capacity server is planned to take
for r in $(seq 1 "${ROUNDS:-2}"); do
  for arm in plain fast; do
    [ $(( T - SECONDS )) -lt $(( PER + 60 )) ] && { echo "no time left for round $r $arm"; break 2; }
    extra=()
    # fast: the engine's defaults (both levers on); plain: as `vllm serve` starts
    [ "$arm" = plain ] && extra=(engine.preload=false)
    [ "$arm" = plain ] && [ "$ENGINE" = vllm ] && extra+=('~engine.env.VLLM_WORKER_MULTIPROC_METHOD')
    [ "$arm" = fast ] && [ "$ENGINE" = sim ] && extra=(engine.preload=true)
    timeout --foreground -s INT -k 30 $(( T - SECONDS - 40 )) python3 -m tuner "${ARGS[@]}" \
      "study.name=fs-$arm" "${extra[@]}" > "$LOGS/fs-$arm-$r.log" 2>&1
    echo "$(date -u +%T) round $r $arm: rc=$? $(grep -o 'ready in [0-9.]* s' "$LOGS/fs-$arm-$r.log" | head -1); $(grep -o 'SLO capacity [^(]*' "$LOGS/fs-$arm-$r.log" | tail -1)"
  done
done
python3 "$ROOT/scripts/gpu/capacity_verdict.py" "$W/fs/outputs/state/optuna.db" fs-fast fs-plain \
  | tee "$LOGS/fs-verdict.txt"
# 3. if time is left: one cold launch of the defaults with vLLM's DEBUG log, to see what fills
# the api and warmup phases (the defaults spent 18 s in warmup warm or cold on 2026-12-02)
if [ $(( T - SECONDS )) -gt 240 ]; then
  cd "$ROOT" && timeout --foreground -s INT -k 20 $(( T - SECONDS - 40 )) python3 benchmarks/startup.py \
    --engine "$ENGINE" --configs defaults --passes cold --hold-s 1 --out "$W/bench/startup-debug.json" \
    --logs "$W/bench/debug" -- +engine.env.VLLM_LOGGING_LEVEL=DEBUG > "$LOGS/bench-debug.log" 2>&1
  echo "$(date -u +%T) debug launch: rc=$? $(tail -1 "$LOGS/bench-debug.log")"
fi
echo "used ${SECONDS}s of $T"
