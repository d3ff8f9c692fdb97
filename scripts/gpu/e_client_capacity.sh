#!/usr/bin/env bash
# Device call for issue #4's client-capacity target (< 1 ms p99 added at 1,000 streams): the
# replay client over 1, 2, 4 and 8 processes against a zero-delay server of 8 processes, on the
# GPU host's CPU cores (32 on nvidia-h200-x2; no GPU is used). After the staging calls:
#   T=560 bash scripts/gpu/e_client_capacity.sh          (carry .whl; about 10 minutes)
# The JSON comes back as $OUT/cap.tgz.part-*; put it at
# benchmarks/results/client_capacity-h200host.json and the table in docs/replay-accuracy.md.
set -u
T="${T:-560}"
source "$(dirname "$0")/common.sh"
mkdir -p "$W/capacity"
nproc > "$W/capacity/nproc.txt"
timeout -s INT -k 20 "$(( T - 30 ))" python3 benchmarks/client_capacity.py \
  --processes ${CAP_PROCESSES:-1 2 4 8} --out "$W/capacity/client_capacity-h200host.json" \
  > "$W/capacity/client_capacity.log" 2>&1
echo "client_capacity rc=$?" >> "$W/capacity/client_capacity.log"
pack cap capacity
tail -n 30 "$W/capacity/client_capacity.log"
