"""vLLM-format log lines on stdout: ``(APIServer pid=N) INFO 11-30 02:13:05 [file.py:NNN] msg``.

Every line is flushed at once so a launcher reading the pipe sees it immediately. Tracebacks of
uncaught API-server exceptions go to stderr (as Python prints them), prefixed like vLLM does.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from typing import TextIO

__all__ = ["SimLog"]


class SimLog:
    """Writes API-server and EngineCore lines; ``engine_pid`` is set once EngineCore starts."""

    def __init__(self, out: TextIO | None = None, err: TextIO | None = None) -> None:
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.api_pid = os.getpid()
        self.engine_pid: int | None = None

    @staticmethod
    def _stamp() -> str:
        return time.strftime("%m-%d %H:%M:%S")

    def _write(self, stream: TextIO, text: str) -> None:
        try:
            stream.write(text + "\n")
            stream.flush()
        except (BrokenPipeError, ValueError, OSError):
            pass

    def api(self, msg: str, where: str = "api_server.py:1944", level: str = "INFO") -> None:
        prefix = f"(APIServer pid={self.api_pid}) "
        for line in msg.split("\n"):
            self._write(self.out, f"{prefix}{level} {self._stamp()} [{where}] {line}")

    def engine(self, msg: str, where: str = "core.py:99", level: str = "INFO") -> None:
        prefix = f"(EngineCore pid={self.engine_pid or self.api_pid}) "
        for line in msg.split("\n"):
            self._write(self.out, f"{prefix}{level} {self._stamp()} [{where}] {line}")

    def engine_traceback(self, frames: Sequence[str], exc_line: str) -> None:
        """``logger.exception`` output of EngineCore: the ERROR line, then the traceback."""
        prefix = f"(EngineCore pid={self.engine_pid or self.api_pid}) "
        self.engine("EngineCore failed to start.", "core.py:1231", "ERROR")
        stamp = self._stamp()
        for line in ["Traceback (most recent call last):", *frames, exc_line]:
            self._write(self.out, f"{prefix}ERROR {stamp} [core.py:1231] {line}")

    def api_traceback(self, frames: Sequence[str], exc_line: str) -> None:
        """An uncaught exception in the API-server process (Python's format, on stderr)."""
        prefix = f"(APIServer pid={self.api_pid}) "
        for line in ["Traceback (most recent call last):", *frames, *exc_line.split("\n")]:
            self._write(self.err, prefix + line)
