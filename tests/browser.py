"""Headless Chromium driven over the DevTools protocol on a pipe (no port, no extra package): open a page,
evaluate JavaScript in it, take screenshots. Tests that need it skip when chromium is missing, and fail
instead when MINISWE_REQUIRE_BROWSER=1 (CI installs it: .ci/browser)."""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time

import pytest

# The flags that keep Chromium off the network: a closed network floods with connection attempts otherwise.
QUIET = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--disable-extensions", "--mute-audio", "--hide-scrollbars"]


def chromium_or_skip() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.environ.get("MINISWE_REQUIRE_BROWSER") == "1":
        pytest.fail("chromium is required (MINISWE_REQUIRE_BROWSER=1) but not installed; run .ci/browser install")
    pytest.skip("chromium not installed (Debian: apt-get install chromium, or .ci/browser install)")


def headless_args(profile: str) -> list[str]:
    return [*QUIET, f"--user-data-dir={profile}"]


class Browser:
    """One Chromium with one page. Every wait has a deadline."""

    def __init__(self, width: int = 1280, height: int = 900, timeout: float = 60):
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="miniswe-chromium-")
        to_browser_r, self.to_browser = os.pipe()
        self.from_browser, from_browser_w = os.pipe()
        # the protocol pipe is fd 3 (commands in) and fd 4 (answers out) in the browser
        self.proc = subprocess.Popen(
            [chromium_or_skip(), *headless_args(self.profile), "--remote-debugging-pipe", f"--window-size={width},{height}",
             "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(3, 4), preexec_fn=lambda: (os.dup2(to_browser_r, 3), os.dup2(from_browser_w, 4)),
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self.buffer = b""
        self.next_id = 0
        self.events: list[dict] = []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Page.enable", session=True)
        self.call("Runtime.enable", session=True)
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=width, height=height, deviceScaleFactor=1, mobile=False)

    def call(self, method: str, session: bool = False, **params) -> dict:
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        os.write(self.to_browser, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise AssertionError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def _read(self) -> dict:
        deadline = time.monotonic() + self.timeout
        while b"\0" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.from_browser], [], [], left)[0]:
                raise AssertionError(f"chromium did not answer within {self.timeout}s")
            chunk = os.read(self.from_browser, 1 << 20)
            if not chunk:
                raise AssertionError("chromium closed the protocol pipe")
            self.buffer += chunk
        message, _, self.buffer = self.buffer.partition(b"\0")
        return json.loads(message)

    def open(self, url: str, ready: str = "document.querySelector('#app[data-rendered-ms]') !== null") -> None:
        self.events.clear()
        self.call("Page.navigate", session=True, url=url)
        self.wait_for(ready)

    def wait_for(self, expression: str, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (timeout or self.timeout)
        while not self.eval(expression):
            if time.monotonic() > deadline:
                raise AssertionError(f"page never got to: {expression}")
            time.sleep(0.05)

    def eval(self, expression: str):
        result = self.call("Runtime.evaluate", session=True, expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def set_value(self, selector: str, value: str, event: str = "input") -> None:
        """Type into an input or choose in a select, as a person would: the value, then its event."""
        self.eval(f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.value = {json.dumps(value)}; "
                  f"e.dispatchEvent(new Event({json.dumps(event)})); }})()")

    def screenshot(self, path: str, full_page: bool = False) -> bytes:
        params = {"format": "png"}
        if full_page:
            params["captureBeyondViewport"] = True
        data = base64.b64decode(self.call("Page.captureScreenshot", session=True, **params)["data"])
        with open(path, "wb") as handle:
            handle.write(data)
        return data

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (AssertionError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        for fd in (self.to_browser, self.from_browser):
            os.close(fd)
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
