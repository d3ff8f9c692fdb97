#!/usr/bin/env bash
# Writes constraints.txt: every package version in this checkout's .venv (after
# `pip install -e ".[dev]"`), which .ci/run installs with `-c constraints.txt`, so that a new
# release of any dependency cannot break a clean checkout unnoticed. Run it after changing the
# dependencies in pyproject.toml, then run the tests; tests/unit/test_pins.py checks that every
# declared dependency is pinned here.
set -euo pipefail
cd "$(dirname "$0")/.."
{
  echo "# pip constraints for CI (.ci/run): written by scripts/pin_ci.sh from a venv with .[dev]"
  echo "# on $(python3 --version 2>&1), $(uname -sm); the versions CI installs"
  .venv/bin/python -m pip freeze --exclude-editable | grep -v '^-e ' | LC_ALL=C sort -f
} > constraints.txt
wc -l constraints.txt
