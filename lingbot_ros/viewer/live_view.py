"""The live 3D view in the browser: the map's points, the camera path, the newest camera.

Served by viser (docs/internals.md, The live view, says why viser) on localhost. The owner of a
Mapper (the node's worker, the offline tool's loop) calls ``update`` after each verb; that call
only hands over references: the newest output, the new camera positions and, at most every
``MAP_REFRESH_S``, a bounded sample of the map that the map builder's thread reads
(``Mapper.view``, a future; bench/viewer_cost.py measures what is left on the frame loop). A
thread of its own waits for the sample and turns them into scene updates, at most every
``DRAW_INTERVAL_S`` and newest wins: what arrives meanwhile replaces what waited. viser sends to each browser from its own event
loop and drops a scene node's older states still queued for a client, so neither a slow browser
nor one that goes away mid-update ever waits the frame loop.
"""
from __future__ import annotations

import dataclasses
import errno
import logging
import socket
import threading
import time
from concurrent.futures import Future

import numpy as np

from lingbot_ros.mapping.store.map_view import MapView, ViewCamera, sample_path

VISER_PIN = "viser==1.1.1"   # setup.py's extra "viewer" and requirements-dev.txt pin the same
DEFAULT_POINT_BUDGET = 200_000
POSE_BUDGET = 10_000        # camera positions drawn (the path is an even sample beyond it)
MAP_REFRESH_S = 1.0         # the map and path are read at most this often; the camera every frame
DRAW_INTERVAL_S = 0.1       # the scene is drawn at most this often (what came meanwhile: one draw);
                            # each draw holds the GIL that the frame loop's host work needs
HOST = "127.0.0.1"


class _QuietHandshakes(logging.Filter):
    """A browser that closes a connection before sending its request (a preconnect, a reload, a
    closed tab) makes websockets log a traceback on the mapping terminal; viser filters it only
    once it served a first request. Nothing of mapping is behind it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != "opening handshake failed"


_QUIET_HANDSHAKES = _QuietHandshakes()   # one instance: addFilter adds it once


class ViewerError(Exception):
    """The view cannot start: what to change is in the text (mapping goes on without it)."""


@dataclasses.dataclass
class _Pending:
    """What waits for the drawing thread: newest wins, except the path positions, which add up."""

    view: Future | None = None              # of a MapView (the map builder's sample)
    output: object | None = None            # the newest MapperOutput (its camera)
    positions: list = dataclasses.field(default_factory=list)   # camera positions since the view

    @property
    def empty(self) -> bool:
        return self.view is None and self.output is None and not self.positions


def _import_viser():
    try:
        import viser
    except ImportError as error:
        raise ViewerError(f"the live view needs viser, which is not installed ({error}): pip install "
                          f"'{VISER_PIN}' (or pip install 'lingbot_ros[viewer]')") from None
    return viser


def _refuse_busy(host: str, port: int) -> None:
    """A clear refusal where the port is taken (viser itself would move to the next free port,
    and the user would open the wrong page)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            why = "in use" if error.errno == errno.EADDRINUSE else error.strerror
            raise ViewerError(f"cannot serve the live view on {host}:{port}: {why}; pick another port "
                              "(viewer_port / --viewer PORT)") from None


class LiveView:
    def __init__(self, port: int, point_budget: int = DEFAULT_POINT_BUDGET, host: str = HOST,
                 title: str = "lingbot_ros live map"):
        if not 1 <= port <= 65535:
            raise ViewerError(f"the live view's port must be 1-65535, got {port}")
        if point_budget < 1:
            raise ViewerError(f"the live view's point budget must be >= 1, got {point_budget}")
        viser = _import_viser()
        _refuse_busy(host, port)
        logging.getLogger("websockets.server").addFilter(_QUIET_HANDSHAKES)
        self._server = viser.ViserServer(host=host, port=port, label=title, verbose=False)
        if self._server.get_port() != port:   # taken between the probe and the bind
            self._server.stop()
            raise ViewerError(f"cannot serve the live view on {host}:{port}: in use; pick another port")
        self._so3 = viser.transforms.SO3
        self.url = f"http://{host}:{port}"
        self.point_budget = point_budget
        self._server.scene.set_up_direction("+z")   # map is REP 105: z up
        self._text = self._server.gui.add_markdown("waiting for the first frame")
        self._pending = _Pending()
        self._lock = threading.Condition()
        self._closed = False
        self._due = 0.0
        self._path = np.zeros((0, 3))
        self._path_poses = 0
        self._size = 1.0                     # the map's size (the camera and the points are drawn to it)
        self.shown: MapView | None = None   # the map view last drawn
        self._offered = self._drawn = 0      # updates handed over, and drawn (``settle``)
        self.error = ""                      # the drawing thread's last error (it goes on)
        self.nodes: dict = {}                # scene node name -> its viser handle, as last drawn
        self._made_by: dict = {}             # scene node name -> the scene.add_* that made it
        self._thread = threading.Thread(target=self._run, name="lingbot_live_view", daemon=True)
        self._thread.start()

    # -- the owner's side (the frame loop): references only (the map is sampled on the map builder's thread)

    def update(self, mapper, outcome, refresh: bool = False) -> None:
        """After a Mapper verb: its newest camera, and the map and path when due (``refresh``: now)."""
        now = time.monotonic()
        view = None
        if refresh or now >= self._due:
            self._due = now + MAP_REFRESH_S
            view = mapper.view(self.point_budget, POSE_BUDGET)
        new = outcome.new
        if not new and view is None:
            return
        with self._lock:
            pending = self._pending
            if view is not None:
                pending.view, pending.positions = view, []
            else:
                pending.positions.extend(output.camera_pose[:3, 3] for output in new)
                del pending.positions[:-POSE_BUDGET]
            if new:
                pending.output = new[-1]
            self._offered += 1
            self._lock.notify_all()

    def show(self, view: MapView) -> None:
        """A whole view at once (a stored run: ``lingbot-ros-map view``)."""
        ready: Future = Future()
        ready.set_result(view)
        with self._lock:
            self._pending = _Pending(view=ready)
            self._offered += 1
            self._lock.notify_all()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        self._thread.join(timeout=5.0)
        self._server.stop()

    def settle(self, timeout_s: float) -> bool:
        """Wait until everything handed over is drawn (the tools, before they say the page is ready)."""
        with self._lock:
            return self._lock.wait_for(lambda: self._drawn == self._offered or self._closed, timeout_s)

    # -- the drawing thread ---------------------------------------------------------------------

    def _run(self) -> None:
        due = 0.0   # the next draw's earliest time
        while True:
            with self._lock:
                while not self._closed and (self._pending.empty or time.monotonic() < due):
                    self._lock.wait(None if self._pending.empty else due - time.monotonic())
                if self._closed:
                    return
                pending, self._pending = self._pending, _Pending()
                upto = self._offered
            due = time.monotonic() + DRAW_INTERVAL_S
            try:
                self._draw(pending)
            except Exception as error:   # a view problem never reaches mapping; the next update tries again
                self.error = f"{type(error).__name__}: {error}"
            with self._lock:
                self._drawn = upto
                self._lock.notify_all()

    def _draw(self, pending: _Pending) -> None:
        scene = self._server.scene
        if pending.view is not None:
            view = self.shown = pending.view.result()
            self._size = self._frame_the_map(view)
            # A voxel's size, or bigger where the map is far larger than its voxels (a sample of it
            # would otherwise be specks).
            self.nodes["/map"] = scene.add_point_cloud("/map", view.xyz, view.rgb, precision="float32",
                                                       point_size=max(view.voxel_size, self._size / 300))
            self._path, self._path_poses = view.camera_positions, view.poses
            if view.camera is not None:
                self._camera(view.camera)
        if pending.positions:
            self._path = sample_path(np.concatenate([self._path, np.array(pending.positions)]), POSE_BUDGET)
            self._path_poses += len(pending.positions)
        if len(self._path) > 1:
            segments = np.stack([self._path[:-1], self._path[1:]], axis=1).astype(np.float32)
            self._node("/trajectory", scene.add_line_segments, {"points": segments}, colors=(255, 64, 32),
                       thickness=2.0, thickness_units="screen")
        if pending.output is not None:
            self._camera(ViewCamera.of_output(pending.output))
        self._text.content = self._status()

    def _frame_the_map(self, view: MapView) -> float:
        """A page opened (or its view reset) from now on looks at the whole map from behind and
        above its start (map: x forward, z up); a page already open keeps its own camera.
        Returns the map's size (its bulk: 2nd to 98th percentile)."""
        points = view.xyz if len(view.xyz) else view.camera_positions
        size = 10 * view.voxel_size
        if len(points):
            low, high = np.percentile(points, [2, 98], axis=0)
            centre, size = (low + high) / 2, max(float((high - low).max()), size)
            self._server.initial_camera.look_at = centre
            self._server.initial_camera.position = centre + size * np.array([-1.0, -0.4, 0.8])
        return size

    def _camera(self, camera: ViewCamera) -> None:
        scene = self._server.scene
        size = 0.05 * self._size
        pose = {"wxyz": self._so3.from_matrix(camera.pose[:3, :3]).wxyz, "position": camera.pose[:3, 3]}
        if camera.fov_y is None:   # intrinsics unknown (a stored run): the camera's axes
            self._node("/camera", scene.add_frame, {"axes_length": size, "axes_radius": size / 20, **pose})
        else:
            self._node("/camera", scene.add_camera_frustum,
                       {"fov": camera.fov_y, "aspect": camera.aspect, "scale": size, **pose}, color=(32, 96, 255),
                       thickness=2.0, thickness_units="screen")

    def _node(self, name: str, add, live: dict, **fixed) -> None:
        """Scene node ``name``, made by ``add`` (a scene.add_* method) the first time or where
        another one made it; after that only its ``live`` props are set in place (viser sends what
        changed). Making a node costs about 0.5 ms of the GIL (viser reads its type hints anew):
        two a frame took 1 ms a frame from the frame loop at 30 Hz (bench/viewer_cost.py)."""
        handle = self.nodes.get(name)
        if handle is None or self._made_by[name] != add.__name__:
            self.nodes[name], self._made_by[name] = add(name, **live, **fixed), add.__name__
            return
        for prop, value in live.items():
            setattr(handle, prop, value)

    def _status(self) -> str:
        view = self.shown
        if view is None:
            return f"poses: {self._path_poses}"
        return (f"points: {len(view.xyz)} of {view.map_points} · poses: {self._path_poses} · "
                f"units: {view.units}")
