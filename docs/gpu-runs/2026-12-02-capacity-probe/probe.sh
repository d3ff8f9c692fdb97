#!/usr/bin/env bash
# Device job (nvidia-h200): issue #29's incumbent probe, chat under objective=capacity, 4 trials.
#   cp .gpu-cap/probe.sh /tmp/probe.sh; bash /tmp/stage/bin/bg.sh start probe env T=... bash /tmp/probe.sh CHECKOUT
set -u
ROOT="$1"; T="${T:-600}"; N="${N:-4}"; ENGINE="${ENGINE:-vllm}"
cd "$ROOT"
if [ -z "${LOCAL_TEST:-}" ]; then
  bash scripts/gpu_setup.sh > /tmp/gpu_setup.log 2>&1 || { tail -20 /tmp/gpu_setup.log; exit 1; }
  source scripts/gpu_env.sh
fi
W="${W:-/tmp/w}"; OUT="${OUT:-/tmp/out}"; mkdir -p "$W/probe" "$W/logs" "$OUT"
echo "setup done at ${SECONDS}s"
cd "$W/probe"
t0=$SECONDS
timeout -s INT -k 30 $(( T - SECONDS - 45 )) python3 -m tuner +workload=chat engine=$ENGINE model=qwen3-8b \
  objective=capacity study.n_trials=$N confirm.enabled=false ${EXTRA:-} > "$W/logs/probe.log" 2>&1
echo "tuner rc=$? in $(( SECONDS - t0 ))s"
nvidia-smi --query-gpu=index,memory.used --format=csv > "$W/logs/nvidia-smi.txt" 2>&1
tar czf - -C "$W" --exclude='vllm_cache' --exclude='*.db-journal' --exclude='requests.jsonl' --exclude='mlruns' logs probe 2>/dev/null | split -b 15m - "$OUT/probe.tgz.part-"
ls -la "$OUT"; echo "used ${SECONDS}s of $T"
