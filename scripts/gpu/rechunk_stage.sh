#!/usr/bin/env bash
# Here, after your own staging script wrote the vLLM stage as .stage/c*/part* (one tar stream in
# name order; scripts/gpu_setup.sh says what it must hold): re-cut it into chunks that fit one
# 64 MiB device call beside this checkout (tracked files + untracked ones git does not ignore
# travel with every call). Writes .st8/part-q?/ (git-ignored), one per call:
#   run: command "mkdir -p /tmp/stage && cp .st8/part-qX/* /tmp/stage/", carry [".st8/part-qX"]
# and scripts/gpu_setup.sh unpacks /tmp/stage/part* on the GPU machine as before (the names sort
# in order, and nothing else may be in /tmp/stage). MIB overrides the chunk size. With "-" it cuts
# the tar stream on its standard input instead of .stage's, and OUT_DIR names the folder (default
# .st8; scripts/gpu/stage_quality.sh writes .stq).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
tree_mib=$(( ( $( (git ls-files -z; git ls-files -z --others --exclude-standard) \
  | du -cb --files0-from=- | tail -1 | cut -f1) + 1048575 ) / 1048576 ))
mib="${MIB:-$(( 63 - tree_mib ))}"
[ "$mib" -ge 8 ] || { echo "the checkout alone is ${tree_mib} MiB; too large to carry a chunk" >&2; exit 1; }
out="${OUT_DIR:-.st8}"
rm -rf "$out" && mkdir -p "$out/all"
if [ "${1:-}" = - ]; then cat; else cat .stage/c*/part*; fi | split -b "${mib}m" -a 1 - "$out/all/part-q"
for f in "$out"/all/*; do n=$(basename "$f"); mkdir -p "$out/$n" && mv "$f" "$out/$n/"; done
rmdir "$out/all"
echo "checkout ${tree_mib} MiB; $(ls "$out" | wc -l) chunks of ${mib} MiB in $out/: $(ls "$out" | tr '\n' ' ')"
