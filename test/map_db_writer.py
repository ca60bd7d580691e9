"""A process that writes a map database run as fast as it can until it is killed (the crash tests).

    python test/map_db_writer.py DB COMMIT_S [FRAMES]

Frame i has the pose translation (i, 2i, 3i) and a keyframe of 500 points every 3rd frame; every
commit prints ``committed <commits> <newest frame index>`` (flushed) once it is on disk.
"""
import sys
import time

import numpy as np

from lingbot_ros.mapping.database.writer import FRAME, POINTS, MapWriter


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

    def report(commits: int, newest: int) -> None:
        print(f"committed {commits} {newest}", flush=True)

    writer = MapWriter(path, {"map_voxel_size_m": 0.05}, "test writer", commit_s, 0, 0.0, 10**6, 0.05, 10**6,
                       on_commit=report)
    for index in range(frames):
        writer.put((FRAME, index, index * 10**8, pose(index), index % 3 == 0, 0, True))
        if index % 3 == 0:
            writer.put((POINTS, *points(index)))
        if writer.failure:
            print(f"failure {writer.failure}", flush=True)
            return
        time.sleep(0.001)
    writer.close()
    print("closed", flush=True)


if __name__ == "__main__":
    main()
