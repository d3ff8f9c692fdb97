#!/usr/bin/env bash
# Device calls D1..D3 (nvidia-h200-x2), CALL=1|2|3, one after another on a warm machine:
#   GPU 0: the long_docs study at 32 in flight (Qwen3-8B shape), search in calls 1-3, its confirm
#          stage (goodput pick and vLLM's defaults side by side) at the end of call 3;
#   GPU 1: call 1 first runs the tuner's client against `vllm bench serve` (with the keep-alive
#          fix and a warm-up run; NO_BENCH=1 skips it), then the image_heavy study on the
#          Qwen3-VL-8B shape, search in calls 1-3 and its confirm stage at the end of call 3.
# Every job stops itself before the call's end: study.timeout_s lets no trial start that cannot
# finish, `timeout --foreground -s INT` is the backstop. T: seconds this call may use (from the script's start).
# If the machine went cold between calls, the state comes back from .gpu-restore/ (the previous
# call's d<K>.tgz.part-* files, carried), or LONG_DB / VL_DB name stored Optuna files to continue.
# The calls as run (exact commands): docs/gpu-runs/2026-11-30-h200x2-long-vl.md,
# ...-confirm-bench.md and ...-long-more.md (long_docs on both GPUs: LONG_EXTRA='engine.gpus=[0,1]
# study.n_workers=2 engine.cpu_pinning=true engine.cpu_reserve=16' with NO_VL=1).
# BENCH=1 runs the client comparison in any call (BENCH_CONC, default "8 64"; BENCH_REPS, default
# 3; BENCH_LIMIT seconds, default 380); NO_VL=1 skips the image_heavy study in this call;
# LONG_CONF / VL_CONF=true|false decide per study whether this call runs its confirm stage.
set -u
T="${T:-560}"
CALL="${CALL:-1}"
source "$(dirname "$0")/common.sh"
left() { echo $(( T - SECONDS )); }
if [ ! -d "$W/long" ] && ls .gpu-restore/*.tgz.part-* > /dev/null 2>&1; then
  cat .gpu-restore/*.tgz.part-* | tar xzf - -C "$W" && echo "restored the state from .gpu-restore"
fi
mkdir -p "$W/long" "$W/vl" "$W/bench"
# LONG_DB / VL_DB: continue a study from a stored Optuna file (e.g. the ones under docs/gpu-runs/)
for pair in "long:${LONG_DB:-}" "vl:${VL_DB:-}"; do
  dir=${pair%%:*}; db=${pair#*:}
  if [ -n "$db" ] && [ ! -f "$W/$dir/outputs/state/optuna.db" ]; then
    mkdir -p "$W/$dir/outputs/state" && cp "$db" "$W/$dir/outputs/state/optuna.db"
    echo "$dir: continuing the study stored in $db"
  fi
done
# the time a trial / the confirm stage takes, as measured on 2026-11-30 (calls D1-D3)
LONG_TRIAL_S="${LONG_TRIAL_S:-260}"      # start-up 121-168 s (a fresh machine compiles) + 96 requests in 80-110 s
LONG_CONFIRM_S="${LONG_CONFIRM_S:-560}"  # two servers x two seeds: 243 + 288 s, + tuner start
VL_TRIAL_S="${VL_TRIAL_S:-200}"          # first start-up > 135 s (compiling), later 66-83 s
VL_CONFIRM_S="${VL_CONFIRM_S:-330}"
LONG_ARGS=(+workload=long_docs engine=$ENGINE model=qwen3-8b study.name=long_docs32-qwen3-8b
  'engine.gpus=[0]' workload.arrival.concurrency=32 workload.num_requests=96 objective=goodput
  'confirm.picks=[goodput,baseline]' confirm.load_factor=1 confirm.duration_factor=1
  ${LONG_EXTRA:-})
VL_ARGS=(+workload=image_heavy engine=$ENGINE model=qwen3-vl-8b study.name=image_heavy-qwen3-vl-8b
  'engine.gpus=[1]' objective=goodput
  'confirm.picks=[goodput,baseline]' confirm.load_factor=1 confirm.duration_factor=1
  ${VL_EXTRA:-})
# study NAME DIR TRIALS TRIAL_S CONFIRM_S ARGS...: the search for as long as this call allows
# (confirm at the end of call 3 only), in $W/DIR, log $LOGS/DIR-d$CALL.log
study() {
  local name=$1 dir=$2 trials=$3 trial_s=$4 confirm_s=$5; shift 5
  local n budget conf=false hard
  n=$(remaining "$trials" "$name" "$dir")
  [ "$CALL" = 3 ] && conf=true
  local ov="${dir^^}_CONF"  # LONG_CONF / VL_CONF=true|false: this call confirms or not
  [ -n "${!ov:-}" ] && conf=${!ov}
  [ "$conf" = true ] || confirm_s=0
  hard=$(( $(left) - 20 ))
  budget=$(( hard - trial_s - confirm_s ))
  if [ "$n" = 0 ] && [ "$conf" = false ]; then echo "$name: no trial left to run"; return; fi
  echo "$name: $n trials to run, search budget ${budget}s, confirm $conf, hard limit ${hard}s"
  if [ "$budget" -lt 1 ]; then
    [ "$conf" = false ] && { echo "no time for a trial in this call"; return; }
    n=0; budget=1
  fi
  cd "$W/$dir"
  timeout --foreground -s INT -k 30 "$hard" python3 -m tuner "$@" study.n_trials="$n" \
    study.timeout_s="$budget" confirm.enabled=$conf
  echo "tuner rc=$?"
}
# CAP=1: issue #4's client-capacity benchmark beside the studies, on cores CAP_CORES (default
# 0-15; give the servers other cores: LONG_EXTRA='engine.cpu_pinning=true engine.cpu_reserve=16'),
# one run per process count (largest first, each its own JSON, so a time limit loses only the last)
if [ -n "${CAP:-}" ]; then
  mkdir -p "$W/capacity"
  ( cd "$ROOT" && CAP_CORES="${CAP_CORES:-0-15}" client_capacity ) \
    > "$W/capacity/client_capacity.log" 2>&1 &
  CAPPID=$!
fi
study long_docs32-qwen3-8b long "${LONG_TRIALS:-12}" "$LONG_TRIAL_S" "$LONG_CONFIRM_S" \
  "${LONG_ARGS[@]}" > "$LOGS/long-d$CALL.log" 2>&1 &
LONG=$!
(
  if { [ "$CALL" = 1 ] || [ -n "${BENCH:-}" ]; } && [ -z "${NO_BENCH:-}" ]; then
    cd "$ROOT"
    # shellcheck disable=SC2086
    CUDA_VISIBLE_DEVICES=1 VLLM_SERVER_DEV_MODE=1 timeout --foreground -s INT -k 30 "${BENCH_LIMIT:-380}" \
      python3 benchmarks/replay_vs_vllm_bench.py --one-server --concurrency ${BENCH_CONC:-8 64} \
      --reps "${BENCH_REPS:-3}" \
      --waves 8 --min-requests 64 \
      --server-cmd "${BENCH_SERVER:-vllm serve} models/qwen3-8b-dummy --load-format dummy --served-model-name m --host {host} --port {port}" \
      --workdir "$W/bench" --out "$W/bench/replay_vs_vllm_bench-h200.json" > "$LOGS/bench.log" 2>&1
    echo "bench rc=$?" >> "$LOGS/bench.log"
  fi
  [ -n "${NO_VL:-}" ] && exit 0
  study image_heavy-qwen3-vl-8b vl "${VL_TRIALS:-12}" "$VL_TRIAL_S" "$VL_CONFIRM_S" \
    "${VL_ARGS[@]}" > "$LOGS/vl-d$CALL.log" 2>&1
) &
VL=$!
wait $LONG $VL ${CAPPID:-}
nvidia-smi --query-gpu=index,memory.used --format=csv > "$LOGS/nvidia-smi-d$CALL.txt" 2>&1
pack "d$CALL" logs long vl bench capacity
for f in long-d$CALL vl-d$CALL bench; do echo "== $f"; tail -n 6 "$LOGS/$f.log" 2>/dev/null; done
[ -n "${CAP:-}" ] && { echo "== capacity"; grep -a "rc=\|1000 streams\|highest" "$W/capacity/client_capacity.log" | tail -n 20; }
echo "call $CALL used ${SECONDS}s of $T"
