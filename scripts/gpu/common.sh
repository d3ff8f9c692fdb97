# Sourced by the device-call scripts in this folder (run on the GPU machine, in the checkout):
# installs the staged vLLM and the tuner's wheels once, then the environment.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
if [ -n "${CPU_ONLY:-}" ]; then  # CPU_ONLY=1: no vLLM (no stage): the tuner's wheels alone
  if [ ! -f /tmp/site/.tuner-ok ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
    touch /tmp/site/.tuner-ok
  fi
  export PYTHONPATH="/tmp/site:$ROOT"
elif [ -z "${LOCAL_TEST:-}" ]; then  # LOCAL_TEST=1: try these scripts here on the simulator
  bash scripts/gpu_setup.sh > /tmp/gpu_setup.log 2>&1 || { tail -20 /tmp/gpu_setup.log; exit 1; }
  source scripts/gpu_env.sh
fi
ENGINE="${ENGINE:-vllm}"
W="${W:-/tmp/w}"
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT" "$W"
# the chat study of docs/results.md: 256 in flight, SLO TTFT <= 2 s and TPOT <= 25 ms (the SLO of
# the hand-made reference runs, docs/gpu-runs/2026-11-30-h200-reference.md), objective goodput,
# 2 picks re-measured side by side
CHAT_ARGS=(+workload=chat engine=$ENGINE model=qwen3-8b study.name=chat256-qwen3-8b
  workload.arrival.concurrency=256 workload.num_requests=1000 workload.slo.tpot_ms=25
  objective=goodput
  'confirm.picks=[goodput,baseline]' confirm.load_factor=1 confirm.duration_factor=1)
# how many trials study $2 (storage under $W/$3, default chat) still lacks to reach $1 finished
# (complete or pruned) trials; configs refused before launch do not count (as in study.n_trials)
remaining() {
  python3 - "$1" "$W" "${2:-chat256-qwen3-8b}" "${3:-chat}" <<'PY'
import sys, optuna
from tuner.stored_trial import counted
optuna.logging.set_verbosity(optuna.logging.WARNING)
try:
    s = optuna.load_study(study_name=sys.argv[3], storage=f"sqlite:///{sys.argv[2]}/{sys.argv[4]}/outputs/state/optuna.db")
    done = sum(t.state.is_finished() and t.state.name != "FAIL" and counted(t) for t in s.trials)
except Exception:
    done = 0
print(max(0, int(sys.argv[1]) - done))
PY
}
LOGS="$W/logs"
mkdir -p "$LOGS"
keep() {  # keep NAME PATTERN: the study's storage ($W/NAME/outputs/state) and log ($LOGS/NAME.log)
  # into $OUT (small: a machine lost mid-study loses no stored trial), and the log's lines that
  # match PATTERN (grep -e), the last 25
  cp "$W/$1/outputs/state/optuna.db" "$OUT/optuna.db" 2>/dev/null
  cp "$LOGS/$1.log" "$OUT/$1.log" 2>/dev/null
  grep -h -e "$2" "$LOGS/$1.log" 2>/dev/null | cut -c1-220 | tail -25
}
stored_db() {  # stored_db DIR: DB=path (a `keep`'s optuna.db committed under docs/gpu-runs/,
  # relative to the checkout; gzipped as optuna.db.gz, ~5x smaller) becomes
  # DIR/outputs/state/optuna.db unless a study is there already: the same command then continues
  # that study on a new machine, adding what it lacks
  mkdir -p "$1/outputs/state"
  if [ -n "${DB:-}" ] && [ ! -f "$1/outputs/state/optuna.db" ]; then
    case "$DB" in
      *.gz) gunzip -c "$ROOT/$DB" > "$1/outputs/state/optuna.db" ;;
      *) cp "$ROOT/$DB" "$1/outputs/state/optuna.db" ;;
    esac
  fi
}
model_of() {  # model_of WL: the model a workload runs on, the Qwen3-VL-8B shape for image_heavy
  # (its images need a vision model), else Qwen3-8B's
  if [ "$1" = image_heavy ]; then echo qwen3-vl-8b; else echo qwen3-8b; fi
}
pack_study() {  # pack_study NAME: the study's storage into $OUT, then pack NAME's run folders and the logs
  cp "$W/$1/outputs/state/optuna.db" "$OUT/optuna.db" 2>/dev/null
  pack "$1" "$1/outputs/runs" logs
}
pack() {  # pack NAME DIR...: folders under $W (study outputs, MLflow store, logs) -> $OUT/NAME.tgz.part-aa, -ab, ...
  # (the device returns at most 8 files of 16 MiB); here: cat NAME.tgz.part-* | tar xzf -
  # An earlier pack's parts go first: a smaller archive would leave its tail behind, and cat would
  # append it (2026-12-05: a study's own pack, then pack_study's, left 3 stale parts of 5)
  local name=$1; shift
  rm -f "$OUT/$name.tgz.part-"*
  tar czf - -C "$W" --exclude='vllm_cache' "$@" 2>/dev/null | split -b 15m - "$OUT/$name.tgz.part-"
  ls -la "$OUT"
}
# client_capacity: issue #4's benchmark once per count in CAP_PROCESSES (largest first, a JSON
# each under $W/capacity, so a time limit loses only the last), on cores CAP_CORES (if set),
# with CAP_SERVERS server processes (default 8) and the client variants CAP_CLIENTS (default
# the benchmark's), stopping 40 s before this call's T
client_capacity() {
  mkdir -p "$W/capacity"
  nproc > "$W/capacity/nproc.txt"
  lscpu > "$W/capacity/lscpu.txt" 2>&1
  local pin=() clients=()
  [ -n "${CAP_CORES:-}" ] && pin=(taskset -c "$CAP_CORES")
  [ -n "${CAP_CLIENTS:-}" ] && clients=(--clients $CAP_CLIENTS)
  for p in ${CAP_PROCESSES:-8 4 2 1}; do
    [ $(( T - SECONDS )) -lt 120 ] && { echo "no time left for P=$p"; break; }
    timeout --foreground -s INT -k 10 "$(( T - SECONDS - 40 ))" "${pin[@]}" \
      python3 benchmarks/client_capacity.py --processes "$p" --server-processes "${CAP_SERVERS:-8}" \
      "${clients[@]}" --out "$W/capacity/client_capacity-h200host-${CAP_TAG:-}p$p.json"
    echo "client_capacity P=$p rc=$?"
  done
}
