#!/usr/bin/env bash
# Device work (issue #30): levers against vLLM's defaults through the tuner's own screen
# (mode=screen, docs/levers.md), each lever on fresh servers interleaved with the defaults'
# (EVERY=2, SERVERS=3: D L L D L D). The table is screen.json / screen.csv / screen.html in the
# run folder. Variables, all optional:
#   WL       workload profile: chat (default), long_docs, image_heavy (on the Qwen3-VL-8B shape;
#            MODEL= for another model)
#   CONC     in flight the search starts from; REQS requests a replay (chat: 256 and 800; the
#            other profiles: their own unless given)
#   LEVERS   screen levers, comma-separated (quant_fp8)   SERVERS  servers per lever (3)
#   EVERY    levers between defaults' servers (2)         STEPS    replays a server at most (6)
#   T        seconds the job may take (1500)              PER      seconds a server is planned (240)
#   DB       a stored screen to continue (a `keep`'s optuna.db, or optuna.db.gz, under
#            docs/gpu-runs/): the same command adds only the servers it lacks, vLLM's defaults
#            first on a new machine
#   EXTRA    Hydra overrides, split on spaces
# study.timeout_s stops asking for servers when one more would not end before T; the one running
# finishes. Calls (carry .whl):
#   bash /tmp/stage/bin/bg.sh start scr env T=1500 ... bash $PWD/scripts/gpu/o_screen.sh
#   then, each call, bash /tmp/stage/bin/bg.sh wait scr 230; W=/tmp/w bash scripts/gpu/o_screen.sh keep
#   finally bash scripts/gpu/o_screen.sh pack: $OUT/scr.tgz.part-*
# `keep` copies the study's storage and log into the call's $OUT on every wait: a machine taken
# back mid-job takes the job's files with it, and waits of ~230 s lose at most one call's servers
# (a 480 s wait lost everything on 2026-12-05, docs/gpu-runs/2026-12-05-levers-chat-h100-2.md).
# long_docs as shipped (from 4 in flight) took over 8 minutes a server on an H100 without finishing
# its search (docs/gpu-runs/2026-12-06-levers-h100.md): run it with CONC=16 STEPS=4
# EXTRA="objective.capacity.rel_width=0.1" and PER=420 (5.8-8 minutes a server). Each run's exact
# variables are in its record under docs/gpu-runs/; what is left to run, with its variables, is in
# docs/levers.md ("What is left of issue #30's table").
# Here, on the simulator (the small workload of tests/helpers/capacity.py):
#   LOCAL_TEST=1 ENGINE=sim CONC=4 REQS=60 T=400 PER=40 LEVERS=kv_fp8 EXTRA="workload.slo.tpot_ms=10
#   workload.slo.ttft_ms=4000 workload.output_tokens.low=16 workload.output_tokens.high=32" bash scripts/gpu/o_screen.sh
set -u
T="${T:-1500}"
source "$(dirname "$0")/common.sh"
case "${1:-run}" in  # after each bg.sh wait: keep (storage + log into $OUT); at the end: pack
  keep) keep scr "SLO capacity\|launching\|ready in"; exit 0 ;;
  pack) pack_study scr; exit 0 ;;
esac
# DB=path: continue a stored screen (e.g. docs/gpu-runs/2026-12-03-levers-screen/optuna.db): the
# same command then adds only the servers it lacks, and the table pools them with the stored ones
stored_db "$W/scr" && cd "$W/scr"
PER="${PER:-240}"  # seconds a server is planned to take (start-up, 4-6 replays, stop)
# shellcheck disable=SC2086  # EXTRA: overrides, split on spaces
# WL=long_docs (or image_heavy): that profile as shipped, from its own load unless CONC / REQS
# are given; chat's defaults here are 256 in flight and 800 requests
WL="${WL:-chat}"
MODEL="${MODEL:-$(model_of "$WL")}"
LOAD=()
if [ "$WL" = chat ] || [ -n "${CONC:-}" ]; then LOAD+=("workload.arrival.concurrency=${CONC:-256}"); fi
if [ "$WL" = chat ] || [ -n "${REQS:-}" ]; then LOAD+=("workload.num_requests=${REQS:-800}"); fi
# --foreground: the tuner stays in this script's process group, so `bg.sh stop scr` reaches it (a
# plain timeout runs it in a group of its own, which bg.sh stop missed on 2026-12-06: the tuner
# went on launching servers, docs/gpu-runs/2026-12-06-levers-h100.md)
timeout --foreground -s INT -k 30 $(( T - SECONDS - 30 )) python3 -m tuner "+workload=$WL" "engine=$ENGINE" \
  "model=$MODEL" mode=screen "${LOAD[@]}" "objective.capacity.max_steps=${STEPS:-6}" \
  "screen.servers=${SERVERS:-3}" "screen.defaults_every=${EVERY:-2}" "screen.only=[${LEVERS:-quant_fp8}]" \
  "study.timeout_s=$(( T - SECONDS - PER - 30 ))" ${EXTRA:-} > "$LOGS/scr.log" 2>&1
echo "$(date -u +%T) screen: rc=$?"
grep -h "SLO capacity\|launching" "$LOGS/scr.log" | cut -c1-240 | tail -20
cat outputs/runs/*/screen.csv 2>/dev/null | tee "$LOGS/screen.csv"
nvidia-smi --query-gpu=index,memory.used --format=csv > "$LOGS/nvidia-smi-scr.txt" 2>&1
# the study's folders and MLflow's database, not its artifact store (scr/mlruns: every figure with
# plotly inlined, 63 MB for 6 servers; `report` draws them again): on 2026-12-06 the whole folder
# packed to 92 MB for 10 servers, past what a call returns, and two of its parts were left out
pack scr scr/outputs scr/mlflow.db logs
echo "used ${SECONDS}s of $T"
