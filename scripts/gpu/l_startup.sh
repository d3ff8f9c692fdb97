#!/usr/bin/env bash
# Device work (nvidia-h200), issues 22 and 23 on real vLLM, one job (bin/bg.sh):
# 1. `model=custom` pointing at a model directory given as a path (the Qwen3-8B shape with dummy
#    weights, the load format asked for explicitly): its dry run (the memory model's GPU from
#    NVML, nvidia-smi beside it), then a chat study of N trials in a fresh directory ($W/a).
#    Its servers fill the shared compile cache (engine.cache_root unset: ~/.cache/tuner/vllm).
# 2. The same command in another fresh directory ($W/b): the same configs (the sampler's seed
#    is study.seed on fresh storage), now on a warm shared cache. Both runs' start-up summaries
#    (median ready time, start-up share, phases, cache hits) side by side.
# 3. benchmarks/startup.py on its own fresh cache (cold, then warm; BENCH_CONFIGS), if time is left.
#   bash /tmp/stage/bin/bg.sh start su env T=1500 bash scripts/gpu/l_startup.sh   (carry .whl)
#   bash /tmp/stage/bin/bg.sh wait su 540 ... ; results: $OUT/su.tgz.part-*
# Here, on the simulator: LOCAL_TEST=1 ENGINE=sim N=2 bash scripts/gpu/l_startup.sh
set -u
T="${T:-1500}"
source "$(dirname "$0")/common.sh"
N="${N:-5}"
ARGS=(+workload=chat "engine=$ENGINE" model=custom "model.path=$ROOT/models/qwen3-8b-dummy"
  model.load_format=dummy study.name=startup-custom "study.n_trials=$N" confirm.enabled=false)
[ "$ENGINE" = sim ] && ARGS+=("engine.cache_root=$W/cache")  # the simulator has none by default
nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv > "$LOGS/nvidia-smi-before.txt" 2>&1
mkdir -p "$W/a" "$W/b"
(cd "$W/a" && python3 -m tuner "${ARGS[@]}" dry_run=true > "$LOGS/dry-run.log" 2>&1)
for d in a b; do
  left=$(( T - SECONDS - 60 ))
  [ "$left" -lt 200 ] && { echo "no time left for run $d"; break; }
  (cd "$W/$d" && timeout --foreground -s INT -k 30 "$left" python3 -m tuner "${ARGS[@]}" \
    "study.timeout_s=$(( left - 150 ))" > "$LOGS/run-$d.log" 2>&1)
  echo "run $d: rc=$? $(grep -ai 'start-up:' "$LOGS/run-$d.log" | tail -1)"
done
left=$(( T - SECONDS - 60 ))
if [ "$left" -gt 300 ]; then
  timeout --foreground -s INT -k 20 "$left" python3 benchmarks/startup.py --engine "$ENGINE" \
    --configs "${BENCH_CONFIGS:-defaults,gmu_0.80}" --passes cold,warm --hold-s "${HOLD:-5}" \
    --out "$W/bench/startup-h200.json" > "$LOGS/bench.log" 2>&1
  echo "bench: rc=$? $(tail -1 "$LOGS/bench.log")"
else
  echo "no time left for the benchmark"
fi
du -sh ~/.cache/tuner/vllm "$W/cache" 2>/dev/null > "$LOGS/cache-du.txt"
find ~/.cache/tuner/vllm -maxdepth 3 2>/dev/null | head -40 >> "$LOGS/cache-du.txt"
mkdir -p "$W/bench"
pack su logs a b bench
echo "used ${SECONDS}s of $T"
