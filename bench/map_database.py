"""The map database's cost: frame-loop time of the recorder's calls, commit latency, bytes written
per frame and per second, and the file's size per 1,000 frames (tiny fixture model, CPU).

The Mapper runs a synthetic moving stream (a textured image shifted sideways); every recorder
call the frame loop makes (frame, removed, cleared, points, sync, continuation) is timed on that
thread, and so is each continuation stored while mapping (built and queued: its device-to-host
copies included); the
writer's commits are timed on its thread. Bytes per frame are also computed for the released
output size from what one keyframe's points take on disk (npy float32 xyz + uint8 rgb).

    python bench/map_database.py                          # 1,000 frames at width 112
    python bench/map_database.py --frames 200 --image-width 518
"""
from __future__ import annotations

import argparse
import json
import sqlite3
import os
import sys
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))   # run from a checkout, installed or not

FIXTURE = Path(os.environ.get("LINGBOT_SHARED", REPO.parent / "shared")) / "fixtures" / "tiny_default"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=1000)
    parser.add_argument("--image-width", type=int, default=112)
    parser.add_argument("--commit-s", type=float, default=1.0)
    parser.add_argument("--continuation-s", type=float, default=30.0, help="map_database_continuation_s")
    parser.add_argument("--images", action=argparse.BooleanOptionalAction, default=True,
                        help="map_database_images: store the keyframes' images (COLMAP export)")
    parser.add_argument("--out", type=Path, default=Path("out/map_database.json"))
    args = parser.parse_args(argv)

    import torch

    from lingbot_ros.mapping import factory
    from lingbot_ros.mapping.database import continuation as continuation_code
    from lingbot_ros.mapping.database.retention import stored_bytes
    from lingbot_ros.mapping.mapper import Mapper
    from lingbot_ros.mapping.records import InputFrame
    from lingbot_ros.mapping.settings import MapperSettings

    torch.set_num_threads(1)
    directory = Path(tempfile.mkdtemp(prefix="map_db_bench_"))
    settings = MapperSettings(checkpoint=str(FIXTURE / "ckpt.pt"), model_config=str(FIXTURE / "config.json"),
                              device="cpu", image_width=args.image_width, warmup=False,
                              map_database=str(directory / "map.db"), map_database_commit_s=args.commit_s,
                              map_database_continuation_s=args.continuation_s, map_database_images=args.images)
    mapper = Mapper(settings, factory.build(settings))
    hook_s = [0.0]
    recorder = mapper.recorder
    for name in ("frame", "removed", "cleared", "points", "sync", "continuation"):
        method = getattr(recorder, name)

        def timed(*a, _method=method, **k):
            start = time.perf_counter()
            _method(*a, **k)
            hook_s[0] += time.perf_counter() - start
        setattr(recorder, name, timed)

    calls = {"continuation": 0}
    queue_continuation = recorder.continuation

    def counted(*a, **k):
        calls["continuation"] += 1
        queue_continuation(*a, **k)
    recorder.continuation = counted
    continuation_ms = []
    # A continuation stored while mapping: built (continuation.continuation_of), then queued.
    build, built_at = continuation_code.continuation_of, []

    def timed_build(*a, **k):
        built_at.append(time.perf_counter())
        return build(*a, **k)

    def timed_queue(*a, **k):
        counted(*a, **k)
        if built_at:
            continuation_ms.append((time.perf_counter() - built_at.pop()) * 1e3)
    recorder.continuation = timed_queue
    continuation_code.continuation_of = timed_build

    base = cv2.resize((np.random.default_rng(1).random((60, 80)) * 255).astype(np.uint8), (640, 480),
                      interpolation=cv2.INTER_CUBIC)
    start = time.perf_counter()
    for index in range(args.frames):
        rgb = np.ascontiguousarray(np.dstack([np.roll(base, 3 * index, axis=1)] * 3))
        mapper.process(InputFrame(rgb=rgb, stamp_ns=index * 33_333_333))
    continuation_code.continuation_of = build   # the clean end's continuation is not one of them
    mapper.finish()
    wall_s = time.perf_counter() - start
    mapper.close()
    commit_ms = list(mapper.recorder.writer.commit_ms)   # the writer times its own commits
    size = stored_bytes(directory / "map.db")
    with sqlite3.connect(directory / "map.db") as conn:
        images, image_bytes = conn.execute("SELECT COUNT(*), COALESCE(SUM(LENGTH(jpeg)), 0) FROM keyframe_images").fetchone()
    points_per_keyframe = len(mapper.store.live_map.points()[0])   # not used for the released estimate
    # The released output size: 518x378 at map_points_stride 4, every point kept (the bound).
    released_points = -(-518 // settings.map_points_stride) * -(-378 // settings.map_points_stride)
    released_bytes_per_keyframe = released_points * 15 + 2 * 128 + 200   # npy headers, row overhead
    result = {
        "frames": args.frames, "image_width": args.image_width, "wall_s": round(wall_s, 1),
        "frame_loop_ms_per_frame": round(hook_s[0] / args.frames * 1e3, 4),
        "commit_ms_median": round(float(np.median(commit_ms)), 2), "commit_ms_max": round(max(commit_ms), 2),
        "commits": len(commit_ms),
        "continuations_stored": len(continuation_ms),
        "continuation_ms_max": round(max(continuation_ms), 2) if continuation_ms else None,
        "frame_loop_ms_per_frame_with_continuations": round(
            (hook_s[0] + sum(continuation_ms) / 1e3) / args.frames * 1e3, 4),
        "database_bytes": size, "bytes_per_frame": round(size / args.frames),
        "mb_per_1000_frames": round(size / args.frames * 1000 / 1e6, 2),
        "mb_per_s_at_30_hz": round(size / args.frames * 30 / 1e6, 3),
        "released_bytes_per_keyframe": released_bytes_per_keyframe,
        "released_mb_per_s_at_30_hz": round(released_bytes_per_keyframe * 30 / 1e6, 2),
        "map_voxels": points_per_keyframe,
        "images": args.images, "keyframe_images_stored": images,
        "image_bytes_per_keyframe": round(image_bytes / images) if images else 0,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
