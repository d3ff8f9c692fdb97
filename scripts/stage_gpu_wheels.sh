#!/usr/bin/env bash
# Here (any machine with PyPI): download the tuner's missing dependencies for the GPU image
# (CPython 3.12, manylinux x86_64) into .whl/ (git-ignored), to carry with one device call.
# antlr4-python3-runtime 4.9.3 ships only as an sdist, so its (pure-Python) wheel is built here.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
rm -rf .whl && mkdir -p .whl
python3 -m pip wheel -q --no-deps "antlr4-python3-runtime==4.9.3" -w .whl
grep -v -e '^#' -e '^antlr4' scripts/requirements-gpu-tuner.txt | grep . > /tmp/tuner-gpu-reqs.txt
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_34_x86_64 --platform manylinux1_x86_64 -d .whl -r /tmp/tuner-gpu-reqs.txt
echo "staged $(ls .whl | wc -l) wheels, $(du -sh .whl | cut -f1)"
