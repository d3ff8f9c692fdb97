"""Pages opened as a person opens them: headless Chromium (Debian's ``chromium``), no network.

:func:`drawn` opens each page in one browser over the DevTools protocol (``--remote-debugging-pipe``:
one start-up for all the pages, a few seconds in all) and says, per page, how many plotly figures
it holds and how many plotly drew. The browser has no network: every proxied request goes to a
closed port (127.0.0.1:9) and every host name resolves to nothing, so a page that needs a CDN
draws nothing.

:func:`chromium` is the browser's path; the tests that need it skip without it, unless
``TUNER_REQUIRE_CHROMIUM=1`` (set by ``.ci/run``, which installs it) makes that a failure.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

NO_NETWORK = ("--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND")

# Waits until every plotly div of the page has plotly's SVG in it (drawn), or plotly.js is
# missing once the page has loaded, or 15 s passed.
_WAIT = """new Promise(done => {
  const t0 = Date.now();
  (function poll() {
    const divs = [...document.querySelectorAll('.plotly-graph-div')];
    const drawn = divs.filter(d => d.classList.contains('js-plotly-plot')
                                   && d.querySelector('.main-svg')).length;
    const loaded = document.readyState === 'complete';
    if ((loaded && divs.length && drawn === divs.length)
        || (loaded && typeof Plotly === 'undefined') || Date.now() - t0 > 15000) {
      done(JSON.stringify({figures: divs.length, drawn: drawn, plotly: typeof Plotly}));
    } else {
      setTimeout(poll, 50);
    }
  })();
})"""


@dataclass(frozen=True)
class Drawn:
    figures: int
    """plotly figure divs in the page (``plotly-graph-div``)."""
    drawn: int
    """of those, the ones plotly drew (``js-plotly-plot`` with a ``main-svg``)."""
    plotly: bool
    """plotly.js loaded."""


def chromium() -> str:
    """The browser's path; skips the test without one (fails under TUNER_REQUIRE_CHROMIUM=1)."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        if os.environ.get("TUNER_REQUIRE_CHROMIUM") == "1":
            pytest.fail("TUNER_REQUIRE_CHROMIUM=1 but no chromium on PATH")
        pytest.skip("no chromium on PATH (Debian: apt-get install chromium)")
    return path


class _Pipe:
    """The DevTools protocol over the pipe pair: JSON messages ending in NUL."""

    def __init__(self, proc: subprocess.Popen[bytes], to_browser: int, from_browser: int) -> None:
        self.proc, self.out, self.inp = proc, to_browser, from_browser
        self.buf = b""
        self.next_id = 0

    def call(
        self, method: str, params: dict[str, Any], session: str | None = None, timeout: float = 60
    ) -> dict[str, Any]:
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params}
        if session is not None:
            msg["sessionId"] = session
        os.write(self.out, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" in self.buf:
                raw, self.buf = self.buf.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("id") == self.next_id:
                    if "error" in reply:
                        raise RuntimeError(f"{method}: {reply['error']}")
                    return dict(reply["result"])
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                raise RuntimeError(f"{method}: no reply (browser exit code {self.proc.poll()})")
            ready, _, _ = select.select([self.inp], [], [], left)
            if ready:
                chunk = os.read(self.inp, 1 << 20)
                if not chunk:
                    raise RuntimeError(f"{method}: the browser closed the pipe")
                self.buf += chunk


def drawn(pages: Sequence[Path]) -> dict[Path, Drawn]:
    """Open each page (a file) in one headless Chromium without network; what plotly drew."""
    browser = chromium()
    # the browser reads commands on fd 3 and writes replies on fd 4
    cmd_r, cmd_w = os.pipe()
    rep_r, rep_w = os.pipe()

    def fds() -> None:  # in the child: the pipe ends to 3 and 4 (above 9 first: no clash)
        high_r = fcntl.fcntl(cmd_r, fcntl.F_DUPFD, 10)
        high_w = fcntl.fcntl(rep_w, fcntl.F_DUPFD, 10)
        os.dup2(high_r, 3)
        os.dup2(high_w, 4)

    profile = tempfile.mkdtemp(prefix="tuner-chromium-")
    try:
        proc = subprocess.Popen(
            [
                browser,
                "--headless",
                "--disable-gpu",
                "--no-sandbox",
                "--no-first-run",
                "--disable-extensions",
                "--disable-dev-shm-usage",
                "--disable-background-networking",
                "--disable-component-update",
                f"--user-data-dir={profile}",
                *NO_NETWORK,
                "--remote-debugging-pipe",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=fds,
            close_fds=False,
            start_new_session=True,  # its renderers and crash handler in its group: stopped together
        )
        os.close(cmd_r)
        os.close(rep_w)
        pipe = _Pipe(proc, cmd_w, rep_r)
        try:
            out: dict[Path, Drawn] = {}
            for page in pages:
                target = pipe.call("Target.createTarget", {"url": "about:blank"})
                session = pipe.call(
                    "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}
                )["sessionId"]
                # answers once the page's document is committed; _WAIT then waits for its load
                pipe.call("Page.navigate", {"url": page.resolve().as_uri()}, session)
                got = pipe.call(
                    "Runtime.evaluate",
                    {"expression": _WAIT, "awaitPromise": True, "returnByValue": True},
                    session,
                )
                seen = json.loads(got["result"]["value"])
                out[page] = Drawn(seen["figures"], seen["drawn"], seen["plotly"] == "object")
                pipe.call("Target.closeTarget", {"targetId": target["targetId"]})
            return out
        finally:
            os.close(cmd_w)
            os.close(rep_r)
            _stop_group(proc)
    finally:
        _remove(Path(profile))


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill the browser's whole process group: killing the browser alone left its children
    writing into the profile while it was removed (CI: "Directory not empty: 'Default'")."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def _remove(profile: Path) -> None:
    """Remove the profile; a child the kill has not reaped yet may still add a file: retry."""
    for _ in range(50):
        try:
            shutil.rmtree(profile)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)
    shutil.rmtree(profile)
