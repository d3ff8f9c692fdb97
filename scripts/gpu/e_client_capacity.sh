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
client_capacity > "$W/capacity/client_capacity.log" 2>&1
pack cap capacity
tail -n 30 "$W/capacity/client_capacity.log"
