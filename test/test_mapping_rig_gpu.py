"""The camera rig on the GPU: a RigMapper of two cameras (one MultiStreamSession: batched steps
through one FlashInfer plan, bf16) against two single-camera Mappers on the GPU (each with its
own session, CUDA graphs and split attention), both measured against float32 single-camera Mappers
as test_stream_multi_gpu.py measures its bf16 streams: the rig's error must be that of the
separate Mappers. The windowed policy switches windows in both cameras, so the batched steps run
across switches."""
import dataclasses

import numpy as np

from lingbot_ros.mapping import factory
from lingbot_ros.mapping.mapper import Mapper
from lingbot_ros.mapping.records import InputFrame
from lingbot_ros.mapping.rig.grouping import RigFrame
from lingbot_ros.mapping.rig.rig_mapper import RigMapper
from lingbot_ros.mapping.settings import MapperSettings

from helpers import GPU, assert_as_accurate_as

pytestmark = GPU

CAMERAS = ("front", "back")


def test_a_rig_on_the_gpu_equals_separate_mappers():
    settings = MapperSettings(model_config="tiny", device="cuda", image_width=70, num_scale_frames=2,
                              scale_frames=2, sliding_window=3, long_run_policy="windowed", window_size=20,
                              overlap_size=4, min_confidence=0.0, map_database="", warmup=False)
    rng = np.random.default_rng(7)
    images = [[np.ascontiguousarray((rng.random((112, 140, 3)) * 255).astype(np.uint8)) for _ in range(50)]
              for _ in CAMERAS]
    rig = RigMapper(settings, factory.build_rig(settings, CAMERAS), CAMERAS)
    alone = [Mapper(settings, factory.build(settings)) for _ in CAMERAS]
    float32 = dataclasses.replace(settings, dtype="float32")
    references = [Mapper(float32, factory.build(float32)) for _ in CAMERAS]
    got = {camera: [] for camera in CAMERAS}
    expected = {camera: [] for camera in CAMERAS}
    reference = {camera: [] for camera in CAMERAS}
    for i in range(50):
        frames = {camera: InputFrame(rgb=images[c][i], stamp_ns=10**9 + i * 10**8 + c * 10**6)
                  for c, camera in enumerate(CAMERAS) if not (c == 1 and i % 7 == 6)}   # back skips some
        outcome = rig.process([RigFrame(camera, frame) for camera, frame in frames.items()])
        for c, camera in enumerate(CAMERAS):
            if camera in frames:
                got[camera] += outcome.outcomes[camera].final
                expected[camera] += alone[c].process(frames[camera]).final
                reference[camera] += references[c].process(frames[camera]).final
    finished = rig.finish()
    for c, camera in enumerate(CAMERAS):
        got[camera] += finished.outcomes[camera].final
        expected[camera] += alone[c].finish().final
        reference[camera] += references[c].finish().final
        assert rig.camera(camera).snapshot.window >= 2, "the run must cross window switches"
        assert ([o.index for o in got[camera]] == [o.index for o in expected[camera]]
                == [o.index for o in reference[camera]])
        for key in ("pose_enc", "depth"):
            assert_as_accurate_as([getattr(o.result, key) for o in got[camera]],
                                  [getattr(o.result, key) for o in expected[camera]],
                                  [getattr(o.result, key) for o in reference[camera]], f"{camera} {key}")
    rig.close()
    for mapper in alone + references:
        mapper.close()
