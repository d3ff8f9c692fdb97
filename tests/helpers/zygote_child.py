"""A server stand-in for engine.preload's tests, run as ``python -m helpers.zygote_child``:
prints its argv, working directory, ``ZYGOTE_*`` variables, ``sys.path`` and CPU cores as one JSON line,
then exits with the code given as its first argument, or sleeps when that is ``sleep``."""

from __future__ import annotations

import atexit
import json
import os
import sys
import time

if __name__ == "__main__":
    atexit.register(print, "atexit ran")  # a forked server exits as a Python program does
    seen = {k: v for k, v in os.environ.items() if k.startswith("ZYGOTE_")}
    said = {"argv": sys.argv[1:], "cwd": os.getcwd(), "env": seen, "pgid": os.getpgid(0)}
    print(json.dumps({**said, "path": sys.path, "cpus": sorted(os.sched_getaffinity(0))}))
    sys.stdout.flush()
    if sys.argv[1] == "sleep":
        time.sleep(600)
    sys.exit(int(sys.argv[1]))
