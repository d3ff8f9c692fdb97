"""What several test modules share: the CLI and its stores (``cli``), the reference study
(``reference``), the tuner's processes (``procs``), stored trials as Optuna's tools see them
(``trials``), the fake vLLM server (``fake_vllm``), the fake ``docker`` CLI (``fake_docker.py``, a
script) and headless Chromium (``chromium``). ``tests/`` is on ``sys.path`` (its conftest), so
test modules import them as ``helpers.NAME``."""
