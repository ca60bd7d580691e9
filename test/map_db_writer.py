"""A process that writes a map database run as fast as it can until it is killed (the crash tests).

    python test/map_db_writer.py DB COMMIT_S [FRAMES [CAMERAS]]

Frame i has the pose translation (i, 2i, 3i) and a keyframe of 500 points every 3rd frame; every
commit prints ``committed <commits> <newest frame index>`` (flushed) once it is on disk. With
CAMERAS (``a,b``) it writes a rig: every frame to each camera's run (camera k's poses and points
times k + 1), the first camera the primary and camera k's scale 1 / (k + 1), told once at the start.
"""
import sys
import time

import numpy as np

from lingbot_ros.mapping.database.events import FRAME, POINTS, RIG_SCALES
from lingbot_ros.mapping.database.writer import MapWriter
from lingbot_ros.mapping.rig.records import PRIMARY, TRAJECTORIES, RigScale


def pose(index: int) -> np.ndarray:
    value = np.eye(4)
    value[:3, 3] = (index, 2 * index, 3 * index)
    return value


def points(index: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(index)
    return (rng.normal(size=(500, 3)).astype(np.float32) + index, rng.integers(0, 255, (500, 3), dtype=np.uint8))


def main() -> None:
    path, commit_s = sys.argv[1], float(sys.argv[2])
    frames = int(sys.argv[3]) if len(sys.argv) > 3 else 10**9
    cameras = sys.argv[4].split(",") if len(sys.argv) > 4 else []

    def report(commits: int, newest: int) -> None:
        print(f"committed {commits} {newest}", flush=True)

    writer = MapWriter(path, {"map_voxel_size_m": 0.05}, "test writer", commit_s, 0, 0.0, 10**6, 0.05, 10**6,
                       on_commit=report, cameras=cameras, primary=cameras[0] if cameras else "")
    if cameras:
        writer.put((RIG_SCALES, {camera: RigScale(1.0, PRIMARY, "the primary camera") if k == 0 else
                                 RigScale(1 / (k + 1), TRAJECTORIES, "told by the test") for k, camera in enumerate(cameras)}))
    for index in range(frames):
        for k in range(max(1, len(cameras))):
            value = pose(index)
            value[:3, 3] *= k + 1
            writer.put((FRAME, index, index * 10**8, value, index % 3 == 0, 0, True), k)
            if index % 3 == 0:
                xyz, rgb = points(index)
                writer.put((POINTS, xyz * (k + 1), rgb), k)
        if writer.failure:
            print(f"failure {writer.failure}", flush=True)
            return
        time.sleep(0.001)
    writer.close()
    print("closed", flush=True)


if __name__ == "__main__":
    main()
