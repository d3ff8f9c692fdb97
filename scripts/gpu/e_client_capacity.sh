#!/usr/bin/env bash
# Device call for issue #4's client-capacity target (< 1 ms p99 added at 1,000 streams): the
# replay client over 1, 2, 4 and 8 processes against a zero-delay server of 8 processes, on the
# GPU host's CPU cores (32 on nvidia-h200-x2; no GPU is used). After the staging calls:
#   T=560 bash scripts/gpu/e_client_capacity.sh          (carry .whl; about 10 minutes)
# The JSONs come back in $OUT/cap.tgz.part-* (measured 2026-11-30: benchmarks/results/
# client_capacity-h200host-p{1,2,4,8}.json, table in docs/replay-accuracy.md).
set -u
T="${T:-560}"
source "$(dirname "$0")/common.sh"
mkdir -p "$W/capacity"
nproc > "$W/capacity/nproc.txt"
for p in ${CAP_PROCESSES:-8 4 2 1}; do  # one JSON per count: a time limit loses only the last
  [ $(( T - SECONDS )) -lt 120 ] && { echo "no time left for P=$p"; break; }
  timeout -s INT -k 10 "$(( T - SECONDS - 40 ))" python3 benchmarks/client_capacity.py \
    --processes "$p" --server-processes 8 --out "$W/capacity/client_capacity-h200host-p$p.json"
  echo "client_capacity P=$p rc=$?"
done > "$W/capacity/client_capacity.log" 2>&1
pack cap capacity
tail -n 30 "$W/capacity/client_capacity.log"
