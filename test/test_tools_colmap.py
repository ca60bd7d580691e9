"""COLMAP export, read back by COLMAP's own reader (pycolmap): lingbot-ros-offline --colmap on a real
sequence (courthouse, tiny fixture model, CPU) and lingbot-ros-map export --format colmap on the
database that run wrote. The poses and cameras reproject the map's points where our own projection
(the saved trajectory, the camera mount, frames.csv's intrinsics) puts them; the images are the
keyframes the names say; a directory holding a model is never overwritten unasked."""
import contextlib
import csv
import io
import shutil

import cv2
import numpy as np
import pycolmap
import pytest

from lingbot_ros.mapping.files.export import read_ply, read_tum
from lingbot_ros.mapping.placement.geometry import parse_mount
from lingbot_ros.mapping.settings import MapperSettings
from lingbot_ros.mapping.stamps import ns_from_text
from lingbot_ros.tools import map_db, offline

pytestmark = pytest.mark.usefixtures("torch_single_thread")

FRAMES = 12
SCALE = 2.0   # --scale-source fixed: the export is in metres


@pytest.fixture(scope="module", params=[(), ("--window-size", "6", "--overlap-size", "2")],
                ids=["one-window", "window-switch"])
def run(shared_dir, tmp_path_factory, request):
    """One offline run with --colmap and a map database (12 courthouse frames, keyframe interval 2;
    windowed, in one window or with a switch: the overlap frames' final values are exported)."""
    fixture, source = shared_dir / "fixtures" / "tiny_default", shared_dir / "data" / "courthouse_jpg"
    assert (fixture / "ckpt.pt").exists() and source.is_dir(), "the tiny fixture and courthouse_jpg are needed"
    root = tmp_path_factory.mktemp("colmap")
    summary = io.StringIO()
    with contextlib.redirect_stdout(summary):
        code = offline.main(["--input", str(source), "--output", str(root / "out"), "--colmap", str(root / "colmap"),
                             "--max-frames", str(FRAMES), "--checkpoint", str(fixture / "ckpt.pt"),
                             "--model-config", str(fixture / "config.json"), "--device", "cpu", "--image-width", "112",
                             "--num-scale-frames", "3", "--scale-frames", "3", "--sliding-window", "4",
                             "--keyframe-interval", "2", "--min-confidence", "1.0", "--map-voxel-size-m", "0.05",
                             "--scale-source", "fixed", "--scale", str(SCALE), "--no-warmup",
                             "--map-database", str(root / "map.db"), *request.param])
    assert code == 0
    assert "images (" in summary.getvalue() and "in metres" in summary.getvalue()
    windows = (root / "out" / "windows.csv").read_text().splitlines()
    assert len(windows) == (3 if request.param else 2)   # header and one row per window
    return root, source


def keyframe_rows(out):
    with open(out / "frames.csv", newline="") as f:
        return {int(row["index"]): row for row in csv.DictReader(f) if row["is_keyframe"] == "1"}


def check_model(directory, out, source):
    """The model in ``directory`` read by pycolmap against our own projection of the run in ``out``."""
    reconstruction = pycolmap.Reconstruction(str(directory / "sparse" / "0"))
    keyframes = keyframe_rows(out)
    assert len(keyframes) >= 8   # 3 scale frames, then every 2nd of frames 3..11 (a new window: more)
    assert sorted(image.name for image in reconstruction.images.values()) == [f"{i:06d}.jpg" for i in sorted(keyframes)]
    xyz, rgb = read_ply(out / "map.ply")
    assert len(reconstruction.points3D) == len(xyz) > 100
    ids = sorted(reconstruction.points3D)
    points = np.array([reconstruction.points3D[i].xyz for i in ids])
    np.testing.assert_allclose(points, xyz.astype(np.float64))
    assert np.array_equal(np.array([reconstruction.points3D[i].color for i in ids]), rgb)
    base_camera = parse_mount(MapperSettings().camera_mount)   # T_base_camera, the default mount
    base_pose = {stamp_ns: pose for stamp_ns, pose, _ in read_tum(out / "trajectory.tum")}   # T_map_base
    for image in reconstruction.images.values():
        index = int(image.name.split(".")[0])
        row = keyframes[index]
        # The image file is that keyframe: the source frame (a folder: frame k is the k-th file), re-encoded.
        exported = cv2.imread(str(directory / "images" / image.name))
        original = cv2.imread(str(source / f"{index:06d}.jpg"))
        assert exported.shape == original.shape
        assert np.abs(exported.astype(int) - original.astype(int)).mean() < 2.0, image.name
        camera = reconstruction.cameras[image.camera_id]
        assert camera.model == pycolmap.CameraModelId.PINHOLE
        assert (camera.width, camera.height) == (original.shape[1], original.shape[0])
        # Our projection: frames.csv's K (model input 112x70, the whole 518x294 image resized per axis)
        # taken to the image's size; the camera = the saved base pose at the frame's stamp @ the mount.
        sx, sy = original.shape[1] / 112, original.shape[0] / 70
        k = np.array([[float(row["fx"]) * sx, 0, float(row["cx"]) * sx],
                      [0, float(row["fy"]) * sy, float(row["cy"]) * sy], [0, 0, 1]])
        camera_pose = base_pose[ns_from_text(row["stamp_s"])] @ base_camera
        in_camera = (points - camera_pose[:3, 3]) @ camera_pose[:3, :3]
        ours = (in_camera / in_camera[:, 2:]) @ k.T
        seen = ((in_camera[:, 2] > 0) & (ours[:, 0] >= 0) & (ours[:, 0] < camera.width)
                & (ours[:, 1] >= 0) & (ours[:, 1] < camera.height))   # the points in this image
        assert seen.sum() > 100, image.name
        theirs = camera.img_from_cam(image.cam_from_world() * points[seen])
        assert np.abs(theirs - ours[seen, :2]).max() < 1.0, image.name


@pytest.mark.slow
def test_offline_colmap_is_read_by_pycolmap(run):
    root, source = run
    check_model(root / "colmap", root / "out", source)


@pytest.mark.slow
def test_map_export_colmap_is_what_the_offline_tool_wrote(run, capsys):
    root, source = run
    assert map_db.main(["export", "--format", "colmap", str(root / "map.db"), str(root / "exported")]) == 0
    assert "in metres" in capsys.readouterr().out
    check_model(root / "exported", root / "out", source)
    for name in ("sparse/0/cameras.bin", "sparse/0/images.bin", "sparse/0/points3D.bin"):
        assert (root / "exported" / name).read_bytes() == (root / "colmap" / name).read_bytes(), name
    exported = sorted(p.name for p in (root / "exported" / "images").iterdir())
    assert exported == sorted(p.name for p in (root / "colmap" / "images").iterdir())
    for name in exported:
        assert (root / "exported" / "images" / name).read_bytes() == (root / "colmap" / "images" / name).read_bytes()


@pytest.mark.slow
def test_a_model_there_is_not_overwritten_unasked(run, tmp_path, capsys):
    root, source = run
    target = tmp_path / "target"
    shutil.copytree(root / "colmap", target)
    (target / "sparse" / "0" / "points3D.bin").write_bytes(b"the user's own model")
    before = {p: p.read_bytes() for p in target.rglob("*") if p.is_file()}
    argv = ["export", "--format", "colmap", str(root / "map.db"), str(target)]
    assert map_db.main(argv) == 1
    assert "already holds a COLMAP model" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in target.rglob("*") if p.is_file()} == before
    assert map_db.main(argv + ["--overwrite"]) == 0
    check_model(target, root / "out", source)
    # A symlink on the way is never followed: the directory it points to stays empty.
    elsewhere, link = tmp_path / "elsewhere", tmp_path / "link"
    elsewhere.mkdir()
    link.symlink_to(elsewhere)
    assert map_db.main(["export", "--format", "colmap", str(root / "map.db"), str(link)]) == 1
    assert "symlink" in capsys.readouterr().err and not any(elsewhere.iterdir())
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "images").symlink_to(elsewhere)
    assert map_db.main(["export", "--format", "colmap", str(root / "map.db"), str(tmp_path / "real")]) == 1
    assert "symlink" in capsys.readouterr().err and not any(elsewhere.iterdir())


@pytest.mark.slow
def test_a_target_that_is_a_file_or_the_database_is_refused(run, tmp_path, capsys):
    """Each refused with its reason; the database and the user's file stay as they were."""
    root, _ = run
    database, notes = root / "map.db", tmp_path / "notes.txt"
    notes.write_text("the user's")
    (tmp_path / "odd" / "images").parent.mkdir()
    (tmp_path / "odd" / "images").write_text("the user's")
    before = {path: path.read_bytes() for path in (database, notes, tmp_path / "odd" / "images")}
    for target, why in ((notes, f"{notes} exists and is not a directory"),
                        (database, f"{database} is the database"),
                        (database / "colmap", f"{database} is not a directory: "),
                        (notes / "a" / "b", f"{notes} is not a directory: "),
                        (tmp_path / "odd", f"{tmp_path / 'odd' / 'images'} exists and is not a directory")):
        assert map_db.main(["export", "--format", "colmap", str(database), str(target), "--overwrite"]) == 1
        assert why in capsys.readouterr().err, target
    assert {path: path.read_bytes() for path in before} == before


@pytest.mark.parametrize("target, why", [("colmap", "already holds a COLMAP model"),
                                         ("a_file", "exists and is not a directory"),
                                         ("a_file/colmap", "a_file is not a directory: ")])
def test_offline_refuses_a_target_before_the_run(tmp_path, capsys, target, why):
    (tmp_path / "colmap" / "sparse" / "0").mkdir(parents=True)
    (tmp_path / "colmap" / "sparse" / "0" / "cameras.bin").write_bytes(b"someone's")
    (tmp_path / "a_file").write_bytes(b"someone's")
    summary = io.StringIO()
    with contextlib.redirect_stdout(summary):
        code = offline.main(["--random-weights", "--input", "synthetic:64x48:2", "--output", str(tmp_path / "out"),
                             "--colmap", str(tmp_path / target)])
    assert code == 1
    assert why in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    assert (tmp_path / "a_file").read_bytes() == b"someone's"


def test_the_database_keeps_an_image_as_long_as_its_pose(tmp_path):
    """The writer stores a final keyframe's image with its pose and drops it with it: a rollback,
    the trajectory's bound, a reset (the offline run above checks the stored bytes themselves)."""
    from lingbot_ros.mapping.database import schema as mdb
    from lingbot_ros.mapping.database.readback import load_keyframe_images
    from lingbot_ros.mapping.database.events import CLEARED, FRAME, IMAGE, REMOVED
    from lingbot_ros.mapping.database.writer import MapWriter

    path = tmp_path / "map.db"
    writer = MapWriter(path, {"camera_mount": "0 0 0 0 0 0"}, "test", commit_s=0.05, max_runs=0, max_mb=0.0,
                       max_poses=3, voxel_size=0.05, max_points=1000)
    rgb, k = np.full((48, 64, 3), 90, np.uint8), np.array([[50.0, 0, 32], [0, 50, 24], [0, 0, 1]])

    def stored():
        assert writer.commit(30.0), writer.failure
        conn = mdb.connect(path, readonly=True)
        try:
            return sorted(load_keyframe_images(conn, writer.run))
        finally:
            conn.close()

    for index in range(3):
        writer.put((FRAME, index, index, np.eye(4), True, 0, True))
        writer.put((IMAGE, index, rgb, k, (64, 48)))   # a model input of the same size: K as it is
    assert stored() == [0, 1, 2]
    writer.put((REMOVED, 2))
    assert stored() == [0, 1]
    for index in (2, 3, 4):   # max_poses 3: frames 0 and 1 leave the trajectory, their images with them
        writer.put((FRAME, index, index, np.eye(4), True, 0, True))
        writer.put((IMAGE, index, rgb, k, (64, 48)))   # a model input of the same size: K as it is
    assert stored() == [2, 3, 4]
    conn = mdb.connect(path, readonly=True)
    image = load_keyframe_images(conn, writer.run)[3]
    conn.close()
    assert (image.width, image.height) == (64, 48) and np.array_equal(image.intrinsic, k)
    assert np.abs(cv2.imdecode(np.frombuffer(image.jpeg, np.uint8), cv2.IMREAD_COLOR).astype(int) - 90).max() <= 2
    writer.put((CLEARED,))
    assert stored() == []
    assert writer.close() and not writer.failure


@pytest.mark.slow
def test_a_database_without_images_says_so(run, tmp_path, capsys):
    """A file of schema 1 (before keyframe images were stored) read-only: no model, and why."""
    import sqlite3

    root, _ = run
    old = tmp_path / "old.db"
    shutil.copy(root / "map.db", old)
    conn = sqlite3.connect(old)
    conn.execute("DROP TABLE keyframe_images")
    conn.execute("UPDATE schema_version SET version = 1")
    conn.commit()
    conn.close()
    assert map_db.main(["export", "--format", "colmap", str(old), str(tmp_path / "out")]) == 1
    assert "holds no keyframe image" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_map_database_images_false_stores_poses_and_map_only(tmp_path, capsys):
    common = ["--model-config", "tiny", "--random-weights", "--input", "synthetic:112x84:4", "--device", "cpu",
              "--num-scale-frames", "2", "--image-width", "112", "--no-warmup", "--min-confidence", "1.0"]
    for flag, database in (("--map-database-images", "with.db"), ("--no-map-database-images", "without.db")):
        assert offline.main(common + ["--output", str(tmp_path / database), flag,
                                      "--map-database", str(tmp_path / database / "map.db")]) == 0
    capsys.readouterr()
    assert map_db.main(["export", "--format", "colmap", str(tmp_path / "with.db" / "map.db"), str(tmp_path / "a")]) == 0
    assert "4 images" in capsys.readouterr().out
    assert len(pycolmap.Reconstruction(str(tmp_path / "a" / "sparse" / "0")).images) == 4
    assert map_db.main(["export", "--format", "colmap", str(tmp_path / "without.db" / "map.db"),
                        str(tmp_path / "b")]) == 1
    assert "holds no keyframe image" in capsys.readouterr().err
