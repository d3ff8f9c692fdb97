#!/usr/bin/env bash
# Device work (nvidia-h200), issue #30, one hold (2026-12-04): first the levers grid's confirm
# stage goes on from its stored storage (docs/gpu-runs/2026-12-03-levers-confirm/optuna.db: the
# defaults' 3 servers and trial 3's round 1 stored; trial 3's rounds 2 and 3 crashed for a missing
# module and run again), then the lever screen on chat with a tight TPOT (p95 <= 15 ms, item 3's
# second profile): vLLM's defaults first, then fp8 weights, --max-num-batched-tokens 2048 and
# --stream-interval 8, one server each, the defaults again (screen.defaults_every=3), from 64 in
# flight; study.timeout_s leaves out a server that would not end in time (the same command goes on).
#   bash /tmp/stage/bin/bg.sh start s env OUT=/tmp/out bash $PWD/scripts/gpu/s_confirm_then_tpot15.sh
# then back to back `bash /tmp/stage/bin/bg.sh wait s 540; W=/tmp/w bash scripts/gpu/q_capacity_study.sh keep`
# (while the confirm runs; `W=/tmp/w2 bash scripts/gpu/o_screen.sh keep` once the screen runs),
# finally `cp /tmp/out/* $OUT/`. T1 and T2: each part's seconds.
set -u
R="$(cd "$(dirname "$0")/../.." && pwd)"
mkdir -p /tmp/w/cs/outputs/state
[ -f /tmp/w/cs/outputs/state/optuna.db ] \
  || cp "$R/docs/gpu-runs/2026-12-03-levers-confirm/optuna.db" /tmp/w/cs/outputs/state/
T="${T1:-660}" W=/tmp/w N=0 EXTRA="study.name=chat256-levers space=levers study=grid \
study.baseline_first=false confirm.enabled=true confirm.rounds=3 \
workload.arrival.concurrency=256 workload.num_requests=800" \
  bash "$R/scripts/gpu/q_capacity_study.sh"
T="${T2:-900}" W=/tmp/w2 SERVERS=1 EVERY=3 CONC=64 REQS=400 LEVERS=quant_fp8,mnbt_2048,stream_8 \
  EXTRA="workload.slo.tpot_ms=15 study.name=chat-tpot15-qwen3-8b-vllm-capacity-screen" \
  bash "$R/scripts/gpu/o_screen.sh"
