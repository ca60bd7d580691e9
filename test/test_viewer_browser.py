"""The live view in a real browser: lingbot-ros-offline --viewer on courthouse frames (tiny fixture
model), the page loaded in headless Chromium; the page must say that it holds the map's points
(the budget's even sample of map.ply) and every pose of trajectory.tum, the scene sent to it
(viser's messages, read from the browser's DevTools) must hold them, and its screenshot is kept
in test/artefacts/ (README.md shows one). Then lingbot-ros-map view of the run's database."""
import os
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgspec
import numpy as np
import pytest
import zstandard
from PIL import Image

from lingbot_ros.mapping.files.export import read_ply, read_tum
from lingbot_ros.mapping.store.map_view import stride

from browser import Browser
from helpers import free_port

REPO = Path(__file__).resolve().parents[1]
ARTEFACTS = REPO / "test" / "artefacts"
FRAMES = 16
BUDGET = 2000

pytestmark = pytest.mark.slow


class Tool:
    """A tool as a subprocess, its stderr read on a thread (the lines it says)."""

    def __init__(self, argv: list):
        self.lines: list[str] = []
        self.process = subprocess.Popen([sys.executable, "-m", *argv], cwd=REPO, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
        self._reader = threading.Thread(target=lambda: self.lines.extend(self.process.stdout), daemon=True)
        self._reader.start()

    def wait_for(self, needle: str, timeout_s: float) -> str:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            for line in list(self.lines):
                if needle in line:
                    return line
            if self.process.poll() is not None:
                self._reader.join(5)
                break
            time.sleep(0.2)
        raise AssertionError(f"{needle!r} never said; output:\n{''.join(self.lines)[-4000:]}")

    def interrupt(self) -> int:
        self.process.send_signal(signal.SIGINT)
        code = self.process.wait(30)
        self._reader.join(5)
        return code


def shows_a_map(path: Path) -> None:
    """The screenshot's middle (between the notice and the panel) holds the drawn map: many pixels
    off the white background, in many colours (the points' and the path's)."""
    pixels = np.asarray(Image.open(path).convert("RGB")).astype(int)[150:650, 330:930]
    drawn = np.abs(pixels - 255).sum(axis=2) > 90
    assert drawn.mean() > 0.02, f"{path}: {drawn.mean():.3f} of the middle drawn"
    assert len(np.unique(pixels[drawn] // 32, axis=0)) > 10, path


def scene_sent(frames: list[bytes]) -> dict:
    """The scene nodes that viser's messages in ``frames`` give the page: name -> props (arrays
    flat, as numpy). viser 1.1.1's wire format (viser/infra/_infra.py, _message_producer): two
    little-endian sizes, the zstd-compressed msgpack of the messages, then their arrays, each
    8-byte aligned, which the messages name by index."""
    nodes = {}
    for frame in frames:
        size, packed = struct.unpack_from("<QQ", frame)
        inner = msgspec.msgpack.decode(zstandard.ZstdDecompressor().decompress(frame[16:16 + packed],
                                                                                max_output_size=size))
        arrays, offset = [], 16 + packed
        for length in inner["binaryBufferLengths"]:
            offset += -offset % 8
            arrays.append(frame[offset:offset + length])
            offset += length

        def value(v):
            return np.frombuffer(arrays[v["__binary_index"]], v["dtype"]) if isinstance(v, dict) else v

        for message in inner["messages"]:
            if message["type"] == "SceneNodeUpdateMessage":
                nodes[message["name"]].update({k: value(v) for k, v in message["updates"].items()})
            elif message["type"] == "RemoveSceneNodeMessage":
                nodes.pop(message["name"], None)
            elif isinstance(message.get("props"), dict) and "name" in message:   # a node made
                nodes[message["name"]] = {k: value(v) for k, v in message["props"].items()}
    return nodes


def check_page(browser: Browser, text: str, xyz: np.ndarray, poses: int, name: str) -> None:
    """Once the page says ``text``: its screenshot (test/artefacts/NAME) shows the map, and, the
    page reloaded, the scene it is sent holds the budget's sample of the map's points (each a
    point of map.ply) with their colours, a path through every pose and the camera."""
    browser.wait_for_text(text)
    time.sleep(5.0)   # the point cloud faded in
    shows_a_map(browser.screenshot(ARTEFACTS / name))
    scene = scene_sent(browser.websocket_frames())
    points = scene["/map"]["points"].reshape(-1, 3)
    assert len(points) == len(xyz[::stride(len(xyz), BUDGET)]) == len(scene["/map"]["colors"]) // 3
    assert {row.tobytes() for row in points} <= {row.tobytes() for row in xyz.astype(np.float32)}
    assert scene["/trajectory"]["points"].size == (poses - 1) * 2 * 3
    assert "/camera" in scene
    browser.wait_for_text(text)   # the page reloaded says it again


def test_offline_viewer_and_stored_run_in_chromium(tmp_path, fixture_files, shared_data):
    out, port = tmp_path / "out", free_port()
    database = tmp_path / "map.db"
    tool = Tool(["lingbot_ros.tools.offline", "--input", str(shared_data("courthouse_jpg")), "--output", str(out),
                 "--model-config", fixture_files["model_config"], "--checkpoint", fixture_files["checkpoint"],
                 "--device", "cpu", "--max-frames", str(FRAMES), "--image-width", "112", "--map-points-stride", "1",
                 "--num-scale-frames", "3", "--scale-frames", "3", "--sliding-window", "8", "--min-confidence", "0",
                 "--map-voxel-size-m", "0.01", "--long-run-policy", "reset", "--map-database", str(database),
                 "--viewer", str(port), "--viewer-point-budget", str(BUDGET)])
    browser = None
    try:
        tool.wait_for(f"live view: http://127.0.0.1:{port}", 300)
        browser = Browser(f"http://127.0.0.1:{port}")   # opened while frames are processed
        tool.wait_for("live view of the final map", 600)
        xyz, _ = read_ply(out / "map.ply")
        poses = len(read_tum(out / "trajectory.tum"))
        assert poses == FRAMES and len(xyz) > BUDGET
        expected = f"points: {len(xyz[::stride(len(xyz), BUDGET)])} of {len(xyz)} · poses: {poses} · units: model units"
        check_page(browser, expected, xyz, poses, "live_view_offline.png")
        assert tool.interrupt() == 0
        browser.close()

        # The run again, from its map database.
        port = free_port()
        tool = Tool(["lingbot_ros.tools.map_db", "view", str(database), "--port", str(port),
                     "--viewer-point-budget", str(BUDGET)])
        tool.wait_for("live view of run 1", 300)
        browser = Browser(f"http://127.0.0.1:{port}")
        check_page(browser, expected, xyz, poses, "live_view_stored_run.png")
        assert tool.interrupt() == 0
    finally:
        if browser is not None:
            browser.close()
        if tool.process.poll() is None:
            tool.process.kill()
