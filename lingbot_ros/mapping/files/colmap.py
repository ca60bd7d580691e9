"""COLMAP export: a run's keyframes and map as COLMAP's binary sparse model, for splatting and NeRF trainers.

    DIR/sparse/0/cameras.bin    one PINHOLE camera per image: the model's intrinsics for that image
                                at the image's own resolution (the model predicts them per frame)
    DIR/sparse/0/images.bin     one image per keyframe: its world-to-camera pose (COLMAP's convention,
                                OpenCV optical axes) in ``map``, metres once the scale is known
    DIR/sparse/0/points3D.bin   the map's points with their colours
    DIR/images/NNNNNN.jpg       the keyframe images the poses belong to (NNNNNN: the Mapper's frame index)

The model gives no feature tracks: images carry no 2D points and points no track (the trainers
read poses, intrinsics, images and the coloured points only). Pure (no ROS): the offline tool and
``lingbot-ros-map export --format colmap`` both write through ``write_colmap``.

The target is checked before anything is written: a symlink on the way (DIR, sparse, sparse/0,
images) is refused, never followed; a directory already holding a COLMAP model (model files in
sparse/0, files in images/) is refused unless ``overwrite`` (the user's data is never replaced
unasked). All files are written all or none (staged_files.StagedFiles).
"""
from __future__ import annotations

import dataclasses
import os
import struct
from pathlib import Path

import cv2
import numpy as np
import torch

from ...stream.results import intrinsic_for_image
from ..placement.geometry import rigid_inverse
from .staged_files import StagedFiles
from ..store.trajectory import Trajectory
from ..placement.geometry import rotation_to_quaternion

PINHOLE = 1            # COLMAP's camera model id: params fx, fy, cx, cy
JPEG_QUALITY = 95      # the keyframe images as stored and exported (about 3 bits per pixel)
MODEL_FILES = ("cameras", "images", "points3D", "rigs", "frames")   # what COLMAP reads from a sparse model


class ColmapExportError(Exception):
    """The export cannot be written where asked (a symlink, another model there); says what to change."""


@dataclasses.dataclass(frozen=True)
class KeyframeImage:
    """A keyframe's image as stored and exported, with the model's intrinsics for it."""

    jpeg: bytes                # the image file's bytes (keyframe_jpeg)
    width: int
    height: int
    intrinsic: np.ndarray      # [3, 3] float64 K for the image at width x height

    @staticmethod
    def of(rgb: np.ndarray, intrinsic, image_size: tuple[int, int]) -> "KeyframeImage":
        """From the frame's RGB image as received and the model's K (a tensor or an array) for its
        input of ``image_size`` (W, H): K is taken back to the received resolution on the host
        (the model input was resized and maybe centre-cropped), which is what the image file holds."""
        model_k = torch.as_tensor(np.asarray(intrinsic.detach().cpu() if hasattr(intrinsic, "detach") else intrinsic,
                                             np.float64))
        k = intrinsic_for_image(model_k, tuple(image_size), rgb.shape[1], rgb.shape[0]).numpy()
        return KeyframeImage(keyframe_jpeg(rgb), rgb.shape[1], rgb.shape[0], k)


@dataclasses.dataclass(frozen=True)
class ColmapImage:
    """One keyframe of the export."""

    index: int                 # the Mapper's frame index (names the file)
    image: KeyframeImage
    camera_pose: np.ndarray    # [4, 4] T_map_camera (camera optical frame)

    @property
    def name(self) -> str:
        return f"{self.index:06d}.jpg"


def export_images(trajectory: Trajectory, camera_base: np.ndarray, keyframes: dict[int, KeyframeImage]) \
        -> list[ColmapImage]:
    """The keyframes that have an image and a pose in the saved trajectory (T_map_base, keyed by
    frame index), with T_map_camera = T_map_base @ T_base_camera; in frame order."""
    base_camera = rigid_inverse(camera_base)
    return [ColmapImage(entry.key, keyframes[entry.key], entry.pose @ base_camera)
            for entry in trajectory if entry.key in keyframes]


@dataclasses.dataclass(frozen=True)
class ColmapSummary:
    directory: Path
    images: int
    points: int
    image_bytes: int
    metric: bool               # metres (the scale was known), else model units

    def text(self) -> str:
        units = "metres" if self.metric else "model units (the metric scale was not known)"
        return (f"COLMAP model in {self.directory}: {self.images} images ({self.image_bytes / 1e6:.1f} MB), "
                f"{self.points} points (sparse/0, images/), in {units}")


def keyframe_jpeg(rgb: np.ndarray) -> bytes:
    """The one encoding of a keyframe image (RGB uint8 [H, W, 3]) for the database and the export."""
    ok, data = cv2.imencode(".jpg", cv2.cvtColor(np.ascontiguousarray(rgb), cv2.COLOR_RGB2BGR),
                            [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
    if not ok:
        raise ValueError(f"could not encode a {rgb.shape} image as JPEG")
    return data.tobytes()


def cameras_bytes(images: list[ColmapImage]) -> bytes:
    """cameras.bin: camera ``i + 1`` is image ``i + 1``'s PINHOLE camera."""
    out = [struct.pack("<Q", len(images))]
    for camera_id, image in enumerate(images, start=1):
        k = image.image.intrinsic
        out.append(struct.pack("<iiQQ4d", camera_id, PINHOLE, image.image.width, image.image.height,
                               k[0, 0], k[1, 1], k[0, 2], k[1, 2]))
    return b"".join(out)


def images_bytes(images: list[ColmapImage]) -> bytes:
    """images.bin: world-to-camera rotation (qw, qx, qy, qz) and translation, camera id, name, no 2D points."""
    out = [struct.pack("<Q", len(images))]
    for image_id, image in enumerate(images, start=1):
        world_camera = rigid_inverse(image.camera_pose)
        qx, qy, qz, qw = rotation_to_quaternion(world_camera[:3, :3])
        out.append(struct.pack("<I7dI", image_id, qw, qx, qy, qz, *world_camera[:3, 3], image_id))
        out.append(image.name.encode("ascii") + b"\0")
        out.append(struct.pack("<Q", 0))
    return b"".join(out)


def points_bytes(xyz: np.ndarray, rgb: np.ndarray) -> bytes:
    """points3D.bin: id, xyz, rgb, error 0 (none measured), an empty track."""
    record = np.dtype([("id", "<u8"), ("xyz", "<f8", 3), ("rgb", "u1", 3), ("error", "<f8"), ("track", "<u8")])
    points = np.zeros(len(xyz), record)
    points["id"] = np.arange(1, len(xyz) + 1)
    points["xyz"] = xyz
    points["rgb"] = rgb
    return struct.pack("<Q", len(xyz)) + points.tobytes()


def model_files(images: list[ColmapImage], xyz: np.ndarray, rgb: np.ndarray) -> dict[str, bytes]:
    """{path relative to DIR: bytes} of the whole export."""
    xyz, rgb = np.asarray(xyz), np.asarray(rgb)
    if xyz.ndim != 2 or xyz.shape[1] != 3 or rgb.shape != xyz.shape or rgb.dtype != np.uint8:
        raise ValueError(f"xyz and rgb must be [N, 3] (rgb uint8), got {xyz.shape} and {rgb.shape} {rgb.dtype}")
    if not np.isfinite(xyz).all():
        raise ValueError("non-finite points: not written")
    for image in images:
        if not (np.isfinite(image.camera_pose).all() and np.isfinite(image.image.intrinsic).all()):
            raise ValueError(f"non-finite pose or intrinsics for frame {image.index}: not written")
    files = {"sparse/0/cameras.bin": cameras_bytes(images), "sparse/0/images.bin": images_bytes(images),
             "sparse/0/points3D.bin": points_bytes(xyz, rgb)}
    files.update({f"images/{image.name}": image.image.jpeg for image in images})
    return files


def _real_directory(path: Path) -> Path:
    """``path`` made a directory (created if absent); a symlink there is refused, never followed."""
    if path.is_symlink():
        raise ColmapExportError(f"{path} is a symlink: not followed (give the real directory)")
    if path.exists() and not path.is_dir():
        raise ColmapExportError(f"{path} exists and is not a directory")
    path.mkdir(exist_ok=True)
    return path


def existing_model(directory: Path) -> list[str]:
    """The COLMAP model files (sparse/0) and images (images/) already in ``directory``."""
    found = []
    for sub, wanted in (("sparse/0", lambda p: p.stem in MODEL_FILES), ("images", lambda p: True)):
        folder = directory / sub
        if folder.is_dir():
            found += [f"{sub}/{p.name}" for p in sorted(folder.iterdir()) if wanted(p)]
    return found


def check_target(directory: str | Path, overwrite: bool) -> Path:
    """Refuse ``directory`` (ColmapExportError, nothing written) when a symlink is on the way, or it
    already holds a COLMAP model and ``overwrite`` is not set; its absolute path otherwise. The
    offline tool calls it before the first frame too, so a refusal costs no run."""
    directory = Path(os.path.abspath(directory))
    for path in (directory, directory / "sparse", directory / "sparse" / "0", directory / "images"):
        if path.is_symlink():
            raise ColmapExportError(f"{path} is a symlink: not followed (give a directory without one)")
        if path.exists() and not path.is_dir():
            raise ColmapExportError(f"{path} exists and is not a directory")
    above = directory.parent   # where DIR is made: a file there would fail only after the run
    while not os.path.lexists(above):
        above = above.parent
    if not above.is_dir():
        raise ColmapExportError(f"{above} is not a directory: {directory} cannot be made in it")
    found = existing_model(directory)
    if found and not overwrite:
        shown = ", ".join(found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")
        raise ColmapExportError(f"{directory} already holds a COLMAP model ({shown}): nothing was written; "
                                "choose another directory, or pass --overwrite to replace it")
    return directory


def write_colmap(directory: str | Path, images: list[ColmapImage], xyz: np.ndarray, rgb: np.ndarray, metric: bool,
                 overwrite: bool = False, staged: StagedFiles | None = None) -> ColmapSummary:
    """The COLMAP export in ``directory`` (module docstring); with ``staged`` only staged there, for
    the caller to commit with its own files. Raises ColmapExportError (nothing written) as
    ``check_target`` does, and for model files in sparse/0 that the export would not replace.
    With ``overwrite``, images of an earlier export that this one lacks stay (the model does not
    name them)."""
    files = model_files(sorted(images, key=lambda image: image.index), xyz, rgb)
    directory = check_target(directory, overwrite)
    stale = [name for name in existing_model(directory) if name not in files]
    if any(name.startswith("sparse/") for name in stale):
        raise ColmapExportError(f"{directory}/sparse/0 holds model files this export does not replace "
                                f"({', '.join(n for n in stale if n.startswith('sparse/'))}): COLMAP would read "
                                "them with the new ones; remove them or choose another directory")
    directory.parent.mkdir(parents=True, exist_ok=True)
    for sub in (directory, directory / "sparse", directory / "sparse" / "0", directory / "images"):
        _real_directory(sub)
    own = staged if staged is not None else StagedFiles()
    try:
        for relative, data in files.items():
            own.add(directory / relative, data)
    except BaseException:
        if staged is None:
            own.discard()
        raise
    if staged is None:
        own.commit()
    return ColmapSummary(directory, len(images), len(xyz), sum(len(image.image.jpeg) for image in images), metric)
