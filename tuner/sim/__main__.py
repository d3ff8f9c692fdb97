"""``python -m tuner.sim serve MODEL_DIR [flags]``."""

from tuner.sim.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
