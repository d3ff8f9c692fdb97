#!/usr/bin/env bash
# One device call (nvidia-h200-x2): `study.repeats` on real vLLM, beside one more long_docs trial.
#   GPU 0: a chat study on the Qwen2.5-0.5B shape with study.repeats=2 (each trial's server
#          replays the workload twice, seeds s and s+1; the trial's metrics are their mean),
#          client_processes=2 and cpu_pinning;
#   GPU 1: the long_docs study continued from LONG_DB (space without enforce_eager).
#   T=470 LONG_DB=docs/gpu-runs/2026-11-30-h200x2-prescreen/long_docs32-optuna.db \
#     bash scripts/gpu/f_repeats.sh                                     (carry .whl)
set -u
T="${T:-470}"
source "$(dirname "$0")/common.sh"
mkdir -p "$W/rep" "$W/long/outputs/state"
[ -n "${LONG_DB:-}" ] && [ ! -f "$W/long/outputs/state/optuna.db" ] && cp "$LONG_DB" "$W/long/outputs/state/optuna.db"
hard=$(( T - SECONDS - 20 ))
( cd "$W/rep" && timeout --foreground -s INT -k 20 "$hard" python3 -m tuner +workload=chat engine=$ENGINE \
    model=qwen-0.5b study.name=chat-repeats-qwen05b 'engine.gpus=[0]' study.repeats=2 objective=throughput \
    study.n_trials="${REP_TRIALS:-3}" workload.num_requests=300 workload.arrival.concurrency=64 \
    workload.client_processes=2 engine.cpu_pinning=true study.timeout_s=$(( hard - 150 )) \
    confirm.enabled=false > "$LOGS/repeats.log" 2>&1; echo "tuner rc=$?" >> "$LOGS/repeats.log" ) &
R=$!
( cd "$W/long" && timeout --foreground -s INT -k 20 "$hard" python3 -m tuner +workload=long_docs \
    engine=$ENGINE model=qwen3-8b study.name=long_docs32-qwen3-8b 'engine.gpus=[1]' \
    workload.arrival.concurrency=32 workload.num_requests=96 objective=goodput \
    'confirm.picks=[goodput,baseline]' confirm.load_factor=1 confirm.duration_factor=1 \
    confirm.enabled=false space.params.enforce_eager.enabled=false workload.client_processes=2 \
    study.n_trials=4 study.timeout_s=20 > "$LOGS/long-f.log" 2>&1; echo "tuner rc=$?" >> "$LOGS/long-f.log" ) &
L=$!
wait $R $L
pack f logs rep long
for f in repeats long-f; do echo "== $f"; grep -v "│\|━\|─\|┃" "$LOGS/$f.log" | grep "goodput\|repeat\|rc=\|FAIL\|Error" | tail -n 12; done
echo "used ${SECONDS}s of $T"
