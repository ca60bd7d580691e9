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

    def websocket_frames(self, quiet_s: float = 5.0, timeout_s: float = 60.0) -> list[bytes]:
        """The page reloaded, and the binary websocket frames it and its workers (viser's client
        talks from a worker) receive until nothing came for ``quiet_s``: DevTools' Network events
        on one connection, each worker attached paused until its Network domain is on."""
        async def record():
            frames = []
            async with websockets.connect(self._target, max_size=None) as connection:
                async def send(method, session=None, **params):
                    await connection.send(json.dumps({"id": next(self._ids), "method": method, "params": params,
                                                      **({"sessionId": session} if session else {})}))
                await send("Network.enable")
                await send("Target.setAutoAttach", autoAttach=True, waitForDebuggerOnStart=True, flatten=True)
                await send("Page.reload")
                end = time.monotonic() + timeout_s
                while time.monotonic() < end:
                    try:
                        message = json.loads(await asyncio.wait_for(connection.recv(), quiet_s))
                    except asyncio.TimeoutError:
                        break
                    method = message.get("method")
                    if method == "Target.attachedToTarget":
                        session = message["params"]["sessionId"]
                        await send("Network.enable", session)
                        await send("Runtime.runIfWaitingForDebugger", session)
                    elif method == "Network.webSocketFrameReceived":
                        response = message["params"]["response"]
                        if response["opcode"] == 2:   # binary: base64 in the event
                            frames.append(base64.b64decode(response["payloadData"]))
            return frames
        return asyncio.run(record())

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
