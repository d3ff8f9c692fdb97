#!/usr/bin/env bash
# Device work (nvidia-h200), issue #29 item 7: the README's GPU study under the capacity objective,
# 8 counted trials, then the confirm stage with the best capacity and vLLM's defaults (the baseline),
# 2 rounds, each on a fresh server. Runs in the background (it takes longer than one call):
#   bash /tmp/stage/bin/bg.sh start cs bash $PWD/scripts/gpu/q_capacity_study.sh   (carry .whl)
# then, back to back, `bash /tmp/stage/bin/bg.sh wait cs 520; bash scripts/gpu/q_capacity_study.sh keep`
# (keep: the study's storage and log into $OUT, small, so a machine lost mid-study loses no
# trial: carry the storage back to $W/cs/outputs/state/ and the same command continues the study);
# at the end `bash scripts/gpu/q_capacity_study.sh pack` (common.sh's pack: $OUT/cs.tgz.part-* in
# 15 MiB pieces: logs and the run folder; the MLflow store stays on the machine).
# Here, on the simulator: LOCAL_TEST=1 ENGINE=sim N=3 bash scripts/gpu/q_capacity_study.sh
# Issue #30's goal on chat with TPOT p95 <= 15 ms: the tuner's own grid over space=levers less
# stream_interval (-7.2 % on this profile), 4 cells, then its confirm stage on 3 + 3 fresh servers.
# On an H100, 2026-12-06 (docs/gpu-runs/2026-12-06-tpot15-grid-h100.md): 15.4 minutes, the pick
# (fp8 weights, no cascade attention) +32.0 % (95 % CI +25.8 ... +38.5 %):
#   T=1660 N=5 EXTRA="study.name=chat-tpot15-levers space=levers ~space.params.stream_interval
#   study=grid confirm.rounds=3 workload.arrival.concurrency=64 workload.num_requests=400
#   workload.slo.tpot_ms=15"
# Issue #30's goal on long_docs, the simulator's pick (docs/levers.md: fp8 weights and fp8 KV,
# +41.5 % on 2 + 2 simulated servers): the tuner's grid over those two flags on the GPU,
# continued over sessions with DB= (each long_docs server takes 6-8 minutes on an H100). N=4 with
# study.baseline_first=false: the grid's 4 cells, vLLM's defaults among them (with the baseline
# first the grid measures the defaults twice: 5 servers on the simulator, 2026-12-06); a grid
# ends once its cells are done, so the same N continues it (max_steps 5: with 4, fp8 weights'
# server still held at its last step, docs/gpu-runs/2026-12-07-long-docs-fp8-h100.md;
# confirm.stop_winner=false: issue #30's goal asks 3 + 3 servers, and a clear gain stops after 2):
#   WL=long_docs T=1560 N=4 EXTRA="study.name=ld-grid study=grid study.baseline_first=false
#   space.params.block_size.enabled=false
#   space.params.max_num_batched_tokens.enabled=false space.params.cudagraph_mode.enabled=false
#   confirm.rounds=3 confirm.stop_winner=false workload.arrival.concurrency=16
#   objective.capacity.rel_width=0.1 objective.capacity.max_steps=5"
# Its first session (docs/gpu-runs/2026-12-07-long-docs-grid-h100.md) ran 2 cells; continue it
# with DB=docs/gpu-runs/2026-12-07-long-docs-grid-h100/optuna.db.gz
set -u
T="${T:-1700}"
source "$(dirname "$0")/common.sh"
case "${1:-run}" in
  keep) keep cs "SLO capacity\|launching\|ready in\|confirm\|verdict\|Recommended"; exit 0 ;;
  pack)
    nvidia-smi --query-gpu=index,memory.used --format=csv > "$LOGS/nvidia-smi-cs.txt" 2>&1
    pack_study cs
    exit 0 ;;
esac
# DB=path: continue a stored study on a new machine (the trials and confirm servers it lacks)
stored_db "$W/cs" && cd "$W/cs"
# WL=long_docs (or image_heavy, on the Qwen3-VL-8B shape): that profile as shipped
WL="${WL:-chat}"
MODEL="${MODEL:-$(model_of "$WL")}"
# shellcheck disable=SC2086  # EXTRA: overrides, split on spaces
# study.deadline_s: no server starts that would not end 90 s before the kill (its teardown and the
# run's report fit there), so the call's end loses no server; the kill stays for one that overruns
timeout --foreground -s INT -k 60 $(( T - SECONDS - 30 )) python3 -m tuner "+workload=$WL" "engine=$ENGINE" \
  "model=$MODEL" objective=capacity "study.n_trials=${N:-8}" 'confirm.picks=[capacity,baseline]' \
  confirm.rounds=2 "study.deadline_s=$(( T - SECONDS - 120 ))" ${EXTRA:-} > "$LOGS/cs.log" 2>&1
echo "$(date -u +%T) study: rc=$?"
grep -h "SLO capacity\|verdict\|Recommended" "$LOGS/cs.log" | cut -c1-240 | tail -20
echo "used ${SECONDS}s of $T"
