"""Headless Chromium (Debian's ``chromium``) driven over the DevTools protocol: load a page, read
its text, take a screenshot. For the tests of web pages (the live view); scripts/test_deps.sh
installs the browser."""
from __future__ import annotations

import asyncio
import base64
import itertools
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import websockets


class Browser:
    """One headless Chromium with one page at ``url`` (software WebGL: no GPU needed)."""

    def __init__(self, url: str, width: int = 1280, height: int = 800):
        binary = shutil.which("chromium")
        assert binary, "chromium is not installed: bash scripts/test_deps.sh .venv"
        self._profile = tempfile.TemporaryDirectory(prefix="lingbot_chromium_")
        self.process = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--use-angle=swiftshader", "--enable-unsafe-swiftshader",
             "--no-first-run", f"--user-data-dir={self._profile.name}", "--remote-debugging-port=0",
             f"--window-size={width},{height}", url],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = Path(self._profile.name) / "DevToolsActivePort"
        end = time.monotonic() + 60
        while not (port_file.is_file() and port_file.read_text().strip()) and time.monotonic() < end:
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30) as answer:
            pages = [t for t in json.load(answer) if t["type"] == "page"]
        self._target = pages[0]["webSocketDebuggerUrl"]
        self._ids = itertools.count(1)

    def _call(self, method: str, **params) -> dict:
        async def call():
            async with websockets.connect(self._target, max_size=None) as connection:
                ident = next(self._ids)
                await connection.send(json.dumps({"id": ident, "method": method, "params": params}))
                while True:
                    message = json.loads(await connection.recv())
                    if message.get("id") == ident:
                        return message.get("result", message)
        return asyncio.run(call())

    def text(self) -> str:
        """The page's visible text."""
        result = self._call("Runtime.evaluate", expression="document.body ? document.body.innerText : ''")
        return result.get("result", {}).get("value", "")

    def wait_for_text(self, needle: str, timeout_s: float = 60.0) -> str:
        end = time.monotonic() + timeout_s
        text = ""
        while time.monotonic() < end:
            text = self.text()
            if needle in text:
                return text
            time.sleep(0.25)
        raise AssertionError(f"{needle!r} never appeared on the page; its text: {text[-2000:]!r}")

    def evaluate(self, expression: str):
        return self._call("Runtime.evaluate", expression=expression, returnByValue=True).get("result", {}).get("value")

    def screenshot(self, path: Path) -> Path:
        data = self._call("Page.captureScreenshot", format="png")["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        """End the browser (again: nothing more)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._profile.cleanup()
