#!/usr/bin/env bash
# Device call for issue 21 point 4 (the replay client adds nothing measurable by default): the
# client the tuner takes by default, workload.client_processes=auto, at 64, 256 and 1,000 paced
# streams on 25 ms engine steps, each beside one process in the tuner's heavy process (the client
# before auto), 2 replays each; CPU only, no GPU and no vLLM (benchmarks/client_capacity.py
# --auto: the zero-delay server on its own cores, auto on the others). Ran on nvidia-h200 (16 cores;
# docs/gpu-runs/2026-12-01-client-auto.md),
# with the tuner's wheels carried in .whl:
#   OUT=$OUT T=300 CPU_ONLY=1 bash scripts/gpu/k_client_auto.sh          (about 2-3 minutes)
# The JSON and the log come back in $OUT (client_capacity-auto-h200host.json, client_auto.log);
# here, without a GPU host: LOCAL_TEST=1 QUICK=1 bash scripts/gpu/k_client_auto.sh
set -u
T="${T:-300}"
source "$(dirname "$0")/common.sh"
mkdir -p "$W/capacity"
nproc > "$W/capacity/nproc.txt"
lscpu > "$W/capacity/lscpu.txt" 2>&1
quick=()
[ -n "${QUICK:-}" ] && quick=(--quick)
timeout --foreground -s INT -k 10 "$(( T - SECONDS - 20 ))" \
  python3 benchmarks/client_capacity.py --auto "${quick[@]}" \
  --out "$OUT/client_capacity-auto-h200host.json" > "$OUT/client_auto.log" 2>&1
echo "client_capacity --auto rc=$?"
cp "$W/capacity/nproc.txt" "$W/capacity/lscpu.txt" "$OUT/"
tail -n 20 "$OUT/client_auto.log"
