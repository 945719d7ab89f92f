"""A headless Chromium driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`:
JSON messages, each ended by a NUL byte, in on file descriptor 3 and out on 4), so a test can
click in a page and screenshot it with the standard library alone."""
from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import time


class Chromium:
    def __init__(self, binary: str, width: int = 1600, height: int = 1200):
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # the browser reads its commands on fd 3 and writes its answers on fd 4 (the child
        # moves the pipe ends there; subprocess keeps those two open)
        self.proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--remote-debugging-pipe", f"--window-size={width},{height}", "about:blank"],
            pass_fds=(3, 4), stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, preexec_fn=_fds_3_and_4(to_browser_r, from_browser_w))
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._ids = 0
        self._buffer = b""
        self.session: str | None = None

    def send(self, method: str, timeout: float = 60, **params) -> dict:
        """Sends a command (to the attached page, once there is one) and returns its result."""
        self._ids += 1
        message = {"id": self._ids, "method": method, "params": params}
        if self.session and not method.startswith(("Target.", "Browser.")):
            message["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            answer = self._read()
            if answer.get("id") == self._ids:
                if "error" in answer:
                    raise RuntimeError(f"Chromium: {method} failed: {answer['error']}")
                return answer["result"]
        raise TimeoutError(f"Chromium did not answer {method} in {timeout} s")

    def _read(self) -> dict:
        while b"\0" not in self._buffer:
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise RuntimeError("Chromium closed its DevTools pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def open(self, url: str) -> None:
        target = self.send("Target.createTarget", url=url)["targetId"]
        self.session = self.send("Target.attachToTarget", targetId=target,
                                 flatten=True)["sessionId"]

    def evaluate(self, expression: str):
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"Chromium: {expression!r} failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30) -> None:
        """Until `expression` is true in the page."""
        deadline = time.monotonic() + timeout
        while not self.evaluate(expression):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the page never had {expression!r}")
            time.sleep(0.5)

    def screenshot(self, path: str) -> None:
        """The whole page, as PNG."""
        size = self.send("Page.getLayoutMetrics")["cssContentSize"]
        data = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                         clip={"x": 0, "y": 0, "width": size["width"],
                               "height": size["height"], "scale": 1})["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def close(self) -> None:
        # a browser that does not answer the close is ended below all the same
        with contextlib.suppress(RuntimeError, TimeoutError, OSError):
            self.send("Browser.close", timeout=10)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)


def _fds_3_and_4(read_end: int, write_end: int):
    """In the child: the pipe ends as fds 3 and 4, where Chromium looks for them."""
    def move():
        # through fresh numbers first, in case either end already is 3 or 4
        r, w = os.dup(read_end), os.dup(write_end)
        os.dup2(r, 3)
        os.dup2(w, 4)
    return move
