#!/usr/bin/env bash
# Device work (nvidia-h200), issue 30's follow-up through the tuner's own screen (mode=screen): a
# lever that moved on one server (fp8 weights, quant_fp8: +20.7 %, docs/gpu-runs/2026-12-02-levers-chat.md)
# on SERVERS fresh servers against as many of vLLM's defaults, interleaved (defaults_every=2: D L L
# D L D for 3). Chat at its own SLO (p95 TTFT <= 2 s, TPOT <= 50 ms), the search from 256 in flight.
# The first run of mode=screen, and of the capacity steps counted in their steady state, on real
# vLLM. study.timeout_s stops asking for servers when one more would not end before T; the one
# running finishes. The screen's table is screen.json / screen.csv / screen.html in the run folder.
#   bash /tmp/stage/bin/bg.sh start scr env T=1500 bash $PWD/scripts/gpu/o_screen.sh   (carry .whl),
#   then bash /tmp/stage/bin/bg.sh wait scr 520; bash scripts/gpu/o_screen.sh keep   (each call),
#   finally bash scripts/gpu/o_screen.sh pack: $OUT/scr.tgz.part-*. SERVERS=1 EVERY=3
#   LEVERS=a,b,... screens several levers at one server each (D L L L D L L L D ...)
#   (copy the log out on every wait: a machine lost mid-job takes the job's files with it,
#   docs/gpu-runs/2026-12-02-screen-fp8.md; `keep` without OUT= writes to the call's own $OUT, and
#   waits of ~230 s lose at most one call's servers: on 2026-12-05 a machine taken back during a
#   480 s wait returned nothing, docs/gpu-runs/2026-12-05-levers-chat-h100-2.md)
# WL=long_docs screens that profile. As shipped (from 4 in flight, 40 requests) one server took
# over 8 minutes on an H100 without finishing its search (docs/gpu-runs/2026-12-06-levers-h100.md):
# each capacity step measures >= 100 requests at ~1 req/s. On 2026-12-06 (two H100s,
# docs/gpu-runs/2026-12-06-long-docs-kv-h100.md) this ran D kv (5.8 and 7.1 minutes a server) and
# a second D stopped by device time: kv_fp8 +9.7 % on 1 + 1, the defaults held at 16-18 in flight
# and lost at 20:
#   WL=long_docs CONC=16 SERVERS=1 EVERY=1 LEVERS=kv_fp8 STEPS=4 EXTRA="objective.capacity.rel_width=0.1"
#     T=1130 PER=330
# Its follow-up, SERVERS=3 EVERY=2 DB=docs/gpu-runs/2026-12-06-long-docs-kv-h100/optuna.db T=1450
# PER=360 on a second H100, ran D kv kv there (docs/gpu-runs/2026-12-06-long-docs-kv-h100-2.md):
# +14.4 % (95 % CI -22.1 ... +68.0 %) on 3 + 2 servers. SERVERS=4 with that run's optuna.db
# T=1470 PER=420 ran one defaults' server on a third H100 before the machine went back
# (docs/gpu-runs/2026-12-06-long-docs-kv-h100-3.md); with that run's optuna.db, T=1560 ran
# D kv D on a fourth: +14.2 % (95 % CI +4.2 ... +25.1 %), 4 + 4, a gain
# (docs/gpu-runs/2026-12-06-long-docs-kv-h100-4.md). fp8 weights there: LEVERS=quant_fp8, a new DB.
# On the simulator its screen of four levers (LEVERS=quant_fp8,kv_fp8,mnbt_2048,mnbt_16384
# EVERY=4, 1 + 2 simulated servers each, 2026-12-06 at 111e0a6; 6.9 minutes on 2 cores): kv_fp8
# +17.8 %, quant_fp8 +12.9 %, mnbt_2048 -6.1 %, mnbt_16384 -0.4 % (the defaults 1.04 req/s twice).
# WL=image_heavy screens that profile on the Qwen3-VL-8B shape (MODEL= for another; the shape
# is in the checkout, models/qwen3-vl-8b-dummy). On the simulator, 2026-12-06, D F D from 4 in
# flight, 60 requests (LOCAL_TEST=1 ENGINE=sim WL=image_heavy CONC=4 REQS=60 T=400 PER=40
# LEVERS=quant_fp8 SERVERS=1 EVERY=1): fp8 weights 29.5 req/s against 22.3 and 22.2, 2 minutes.
# On an H100 the defaults' server took 3.1 minutes (13.49 req/s, STEPS=4;
# docs/gpu-runs/2026-12-06-image-heavy-probe-h100.md): next, LEVERS=quant_fp8,kv_fp8 EVERY=2
# SERVERS=1 STEPS=6 (D F K D). Two tries of it (2026-12-06 night, T=1040 and a D F at T=570) lost
# their H100s in the first wait (docs/gpu-staging.md). The simulator's screen of the same queue
# and mnbt_16384 (the small load above, EVERY=2, 1 + 3 servers, 2026-12-07, 3.8 minutes on 2
# cores): quant_fp8 +31.6 %, kv_fp8 +5.1 %, mnbt_16384 +0.1 % (the defaults 22.1-22.2 req/s).
# On an H100 on 2026-12-07, SERVERS=2 EVERY=2 LEVERS=quant_fp8,kv_fp8 STEPS=5 T=1480 PER=220 ran
# D F K D K F in 23 minutes: quant_fp8 +0.6 %, kv_fp8 +1.0 %, 2 + 2, no significant change
# (docs/gpu-runs/2026-12-07-image-heavy-screen-h100.md; re-derived by scripts/gpu/screen_again.py)
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
