"""A server for engine.preload's hung-fork test, run as ``python -m helpers.hang_when_forked``
with the simulator's arguments: forked from a zygote that imported ``helpers.fork_marker`` it
hangs without a word, as a fork of a multi-threaded interpreter can; started as a process it is
the simulator."""

from __future__ import annotations

import runpy
import sys
import time

if __name__ == "__main__":
    if "helpers.fork_marker" in sys.modules:
        time.sleep(600)
    runpy.run_module("tuner.sim", run_name="__main__", alter_sys=True)
