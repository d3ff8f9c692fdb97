#!/usr/bin/env bash
# One device call (nvidia-h200-x2): the long_docs confirm stage on GPU 0 (d_long_vl.sh with
# LONG_CONF=true, LONG_EXTRA='engine.gpus=[0] ...') and, beside it on GPU 1, the launch retry on
# a taken port against real vLLM (port_clash.py: a 1-trial chat study on the Qwen2.5-0.5B shape
# whose first launch finds its port held). The port-clash log lands in logs/port-clash.log of
# the packed d$CALL.tgz.
#   T=560 CALL=2 NO_BENCH=1 NO_VL=1 LONG_CONF=true LONG_DB=... LONG_EXTRA='engine.gpus=[0]' \
#     bash scripts/gpu/g_confirm_clash.sh                                    (carry .whl)
set -u
source "$(dirname "$0")/common.sh"
( python3 scripts/gpu/port_clash.py "$W/clash" 'engine.gpus=[1]' > "$LOGS/port-clash.log" 2>&1
  echo "port_clash rc=$?" >> "$LOGS/port-clash.log" ) &
bash scripts/gpu/d_long_vl.sh
wait
echo "== port clash"; grep -a "ports handed\|attempt 1 log\|^ok\|^FAIL\|rc=" "$LOGS/port-clash.log"
