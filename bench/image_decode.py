"""JPEG/PNG decode time per frame: the package's decoder (lingbot_ros.io.image_codec) against
OpenCV and Pillow on the same payloads, and whether the three give the same pixels.

Payloads are the files of a JPEG folder (default ../shared/data/courthouse_jpg, or under
$LINGBOT_SHARED) read into memory,
and the same frames re-encoded as PNG. Per decoder: the best of --repeats passes over all frames,
as ms per frame (one pass decodes every frame once; a warm-up pass is not timed; the
decoders' passes take turns).

  python bench/image_decode.py
  python bench/image_decode.py --folder ../shared/data/loop_jpg --repeats 10
"""
from __future__ import annotations

import argparse
import io
import os
import sys
import time
from pathlib import Path

import cv2
import numpy as np
from PIL import Image, ImageOps

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))   # run from a checkout, installed or not

from lingbot_ros.io.image_codec import decode_compressed  # noqa: E402

SHARED = Path(os.environ.get("LINGBOT_SHARED", REPO.parent / "shared"))


def opencv_rgb(payload: bytes) -> np.ndarray:
    return cv2.cvtColor(cv2.imdecode(np.frombuffer(payload, np.uint8), cv2.IMREAD_COLOR),
                        cv2.COLOR_BGR2RGB)


def pillow_rgb(payload: bytes) -> np.ndarray:
    """Spec §3's loader: PIL open, EXIF orientation, RGB."""
    return np.array(ImageOps.exif_transpose(Image.open(io.BytesIO(payload))).convert("RGB"))


DECODERS = {"lingbot_ros.io": decode_compressed, "opencv": opencv_rgb, "pillow": pillow_rgb}


def ms_per_frame(payloads: list[bytes], repeats: int) -> dict[str, float]:
    """Best pass per decoder; passes take turns, so a burst of load on a shared machine hits
    every decoder alike."""
    for decode in DECODERS.values():
        for payload in payloads:
            decode(payload)
    best = dict.fromkeys(DECODERS, float("inf"))
    for _ in range(repeats):
        for name, decode in DECODERS.items():
            start = time.perf_counter()
            for payload in payloads:
                decode(payload)
            best[name] = min(best[name], time.perf_counter() - start)
    return {name: seconds / len(payloads) * 1e3 for name, seconds in best.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--folder", type=Path,
                        default=SHARED / "data" / "courthouse_jpg",
                        help="folder of .jpg files (default: $LINGBOT_SHARED or ../shared)")
    parser.add_argument("--repeats", type=int, default=5, help="timed passes per decoder")
    args = parser.parse_args(argv)
    files = sorted(args.folder.glob("*.jpg"))
    if not files:
        parser.error(f"{args.folder} holds no .jpg files")
    jpegs = [path.read_bytes() for path in files]
    pngs = [cv2.imencode(".png", cv2.imdecode(np.frombuffer(p, np.uint8), cv2.IMREAD_COLOR))[1]
            .tobytes() for p in jpegs]
    first = decode_compressed(jpegs[0])
    print(f"{len(files)} frames of {args.folder}, {first.shape[1]}x{first.shape[0]}, "
          f"JPEG {np.mean([len(p) for p in jpegs]) / 1e3:.0f} KB, "
          f"PNG {np.mean([len(p) for p in pngs]) / 1e3:.0f} KB on average")
    for name, decode in DECODERS.items():
        if name == "lingbot_ros.io":
            continue
        differ = sum(not np.array_equal(decode_compressed(p), decode(p)) for p in jpegs)
        print(f"JPEG frames whose pixels differ, lingbot_ros.io vs {name}: {differ}")
    jpeg_ms, png_ms = ms_per_frame(jpegs, args.repeats), ms_per_frame(pngs, args.repeats)
    print("| decoder | JPEG ms/frame | PNG ms/frame |\n| --- | --- | --- |")
    for name in DECODERS:
        print(f"| {name} | {jpeg_ms[name]:.2f} | {png_ms[name]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
