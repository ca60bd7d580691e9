"""mapping/warmup_size.py: the size the warm-up runs on, and that a warm-up on the images' own size
leaves nothing to build at the first frame (issue 26, item 6)."""
import numpy as np
import pytest

from lingbot_ros.io.sources import open_source
from lingbot_ros.mapping.records import WARMUP, InputFrame
from lingbot_ros.mapping.settings import MapperSettings, SettingsError
from lingbot_ros.mapping.warmup_size import FoundSize, found_in_source, warmup_size


def test_an_explicit_size_wins_and_auto_takes_what_was_found():
    explicit = warmup_size(MapperSettings(warmup_image_size="320x240", image_width=112),
                           FoundSize("camera_info on /cam/camera_info", (518, 294)))
    assert (explicit.text, explicit.source, explicit.warning) == ("320x240", "warmup_image_size", "")
    found = warmup_size(MapperSettings(image_width=112), FoundSize("camera_info on /cam/camera_info", (518, 294)))
    # 518x294 at width 112: height round(294 * 112 / 518 / 14) * 14 = 70 (spec 3).
    assert found.describe() == "518x294 images (from camera_info on /cam/camera_info; model input 112x70)"


@pytest.mark.parametrize("found, warning", [
    (FoundSize("camera_info on /c", (100_000, 100_000)), "more than 67108864 pixels"),
    (FoundSize("camera_info on /c", (4, 3)), "smaller than one patch"),
    (FoundSize("camera_info on /c", (5000, 20)), "too wide"),
    (FoundSize("camera_info on /c", refused="camera_info: size 0x0"), "camera_info: size 0x0"),
])
def test_auto_refuses_a_size_the_node_would_not_take_and_says_why(found, warning):
    size = warmup_size(MapperSettings(), found)
    assert (size.width, size.height, size.source) == (640, 480, "the default")
    assert size.warning.startswith("camera_info on /c refused: ") and warning in size.warning


def test_auto_without_a_size_falls_back_quietly_with_the_reason():
    size = warmup_size(MapperSettings(), FoundSize("camera_info on /c", absent="none arrived within 1 s"))
    assert size.text == "640x480" and not size.warning
    assert size.source == "the default: camera_info on /c: none arrived within 1 s"
    assert warmup_size(MapperSettings()).source == "the default: nothing to read the images' size from"


@pytest.mark.parametrize("value, text", [
    ("640*480", "'warmup_image_size' must be auto or WIDTHxHEIGHT"),
    ("Auto", "'warmup_image_size' must be auto or WIDTHxHEIGHT"),
    ("100000x100000", "'warmup_image_size' must be at most 67108864 pixels"),
    ("10x10", "'warmup_image_size' (10x10): image 10x10 is smaller than one patch"),
])
def test_a_bad_setting_is_refused_naming_it(value, text):
    with pytest.raises(SettingsError) as error:
        MapperSettings(warmup_image_size=value)
    assert text in str(error.value)


def test_a_sources_first_image_gives_its_size(shared_dir, tmp_path):
    folder = shared_dir / "data" / "courthouse_jpg"
    found = found_in_source(open_source(str(folder)))
    assert found.size == (518, 294) and found.where.startswith(f"the first image of folder {folder}")
    assert found_in_source(open_source(str(shared_dir / "data" / "courthouse_bag"))).size == (518, 294)
    assert found_in_source(open_source("synthetic:160x120:5")).size == (160, 120)
    # A first image that does not decode is passed over quietly (the run reports it).
    broken = tmp_path / "frames"
    broken.mkdir()
    (broken / "000000.jpg").write_bytes(b"not a jpeg")
    (broken / "000001.jpg").write_bytes((folder / sorted(p.name for p in folder.iterdir())[0]).read_bytes())
    reported = []
    source = open_source(str(broken), on_undecodable=reported.append)
    assert found_in_source(source).size == (518, 294) and reported == []
    (broken / "000001.jpg").unlink()
    assert found_in_source(open_source(str(broken))).absent == "no frame decodes"


def _courthouse(shared_dir, count):
    source = open_source(str(shared_dir / "data" / "courthouse_jpg"))
    return source, [InputFrame(rgb=f.rgb, stamp_ns=f.stamp_ns) for f, _ in zip(source, range(count))]


def test_a_warm_up_on_the_sources_size_builds_nothing_at_the_first_frame(tiny_mapper, shared_dir):
    """The session keeps what the warm-up built (its cache, on CUDA the captured graph) only for
    the same model input size; a first frame of another size builds them again."""
    source, frames = _courthouse(shared_dir, 5)
    for found, rebuilt in ((found_in_source(source), False), (None, True)):   # None: the 640x480 default
        mapper = tiny_mapper()
        size = warmup_size(mapper.settings, found)
        mapper.warm_up(size)
        session = mapper.session
        warmed = session.stats().kv_cache.bytes_allocated
        outcomes = [mapper.process(f) for f in frames]
        outputs = [o for outcome in outcomes for o in outcome.new]
        assert len(outputs) == 5
        after = session.stats().kv_cache.bytes_allocated
        assert (after != warmed) == rebuilt, (size, warmed, after)
        # The model input the warm-up prepared is the live frames' (the depth maps' size).
        same_input = tuple(outputs[0].result.depth.shape[-2:]) == size.model_input[::-1]
        assert same_input != rebuilt
        # The first frame says so where it is not what the warm-up prepared (the node logs it).
        notices = [n.text for outcome in outcomes for n in outcome.notices if n.kind == WARMUP]
        assert notices == ([] if not rebuilt else [
            "the first image (518x294, model input 112x70) is not the size the warm-up ran on, 640x480 images "
            "(the default: nothing to read the images' size from; model input 112x84): its cache is built again "
            "(on CUDA its graph captured again); set warmup_image_size to the camera's WxH"])
        mapper.close()


def test_warm_up_leaves_the_outputs_as_without(tiny_mapper, shared_dir):
    source, frames = _courthouse(shared_dir, 5)
    warmed, cold = tiny_mapper(), tiny_mapper()
    warmed.warm_up(warmup_size(warmed.settings, found_in_source(source)))
    a = [o for f in frames for o in warmed.process(f).new]
    b = [o for f in frames for o in cold.process(f).new]
    np.testing.assert_array_equal(np.stack([o.camera_pose for o in a]), np.stack([o.camera_pose for o in b]))
    warmed.close()
    cold.close()
