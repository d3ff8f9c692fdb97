#!/usr/bin/env bash
# One device call (nvidia-h200-x2): the chat study (CHAT_ARGS: 256 in flight, 1,000 requests, SLO
# TTFT <= 2 s and TPOT <= 25 ms, objective goodput) two trials at a time on GPUs 0 and 1, with
# the features that had only run on the simulator: engine.cpu_pinning=true (servers on cores of
# their own, the tuner and its replay clients on the engine.cpu_reserve cores),
# workload.client_loop=LOOP (default uvloop), workload.client_processes=PROCS (default 2) and the
# per-trial event-loop lag probe (always on). The study's storage stays under $W/pin, so a second
# call continues it (TRIALS counts finished trials in all).
#   T=560 TRIALS=4 bash scripts/gpu/i_pinned_study.sh                      (carry .whl)
# Here, on the simulator: LOCAL_TEST=1 ENGINE=sim EXTRA='engine.cpu_reserve=0' ...
# Results: $OUT/pin-$TAG.tgz.part-* (logs, the study's outputs and MLflow store).
set -u
T="${T:-560}"
TAG="${TAG:-1}"
source "$(dirname "$0")/common.sh"
mkdir -p "$W/pin" && cd "$W/pin"
NAME=chat256-pinned-qwen3-8b
N=$(remaining "${TRIALS:-4}" "$NAME" pin)
echo "pinned chat study: $N trials to run"
hard=$(( T - SECONDS - 50 ))
# shellcheck disable=SC2086
timeout --foreground -s INT -k 30 "$hard" python3 -m tuner "${CHAT_ARGS[@]}" study.name=$NAME \
  'engine.gpus=[0,1]' study.n_workers=2 study.n_trials="$N" confirm.enabled=false \
  study.timeout_s=$(( hard - 200 )) engine.cpu_pinning=true \
  workload.client_loop="${LOOP:-uvloop}" workload.client_processes="${PROCS:-2}" ${EXTRA:-} \
  > "$LOGS/pin-study-$TAG.log" 2>&1
echo "tuner rc=$?" | tee -a "$LOGS/pin-study-$TAG.log"
nvidia-smi --query-gpu=index,memory.used --format=csv > "$LOGS/nvidia-smi-pin-$TAG.txt" 2>&1
pack "pin-$TAG" logs pin
grep -v "│\|━\|─\|┃" "$LOGS/pin-study-$TAG.log" | grep -i "pinning\|cores\|lag\|loop\|trial\|rc=\|error" | tail -n 25
echo "used ${SECONDS}s of $T"
