"""MapperSettings: every choice of the mapping pipeline, one name each, validated when built
(each field by its ``setting`` here, the rules between fields in settings_rules.py).

The node declares one ROS parameter per field and the command-line tools one flag per field
(``sliding_window`` is the parameter ``sliding_window`` and the flag ``--sliding-window``), with
the defaults and help texts written here. Front-end-only settings (topics, QoS, output files)
live with their front end and use the same helpers (``setting``, ``validate``).
"""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Callable, Mapping

from ..io.decode_errors import DEFAULT_MAX_PIXELS
from ..stream import SettingsError   # one error type for every settings problem
from ..stream.settings import BACKENDS, DTYPES, KV_CACHE_DTYPES
from .placement.metric_scale import SCALE_SOURCES
from .windows.similarity import ESTIMATORS

KEYFRAME_POLICIES = ("interval", "motion")
LONG_RUN_POLICIES = ("windowed", "reset", "none")


# When a setting may change (the node maps these to read-only / live ROS parameters):
CONFIGURE = "configure"   # fixed while the model is loaded (read-only parameter)
ACTIVATE = "activate"     # taken at activate (inputs); may change while inactive
LIVE = "live"             # applied at once, between frames


def setting(default, help: str, *, choices: tuple | None = None, minimum: float | None = None,
            above: float | None = None, maximum: float | None = None,
            check: Callable[[Any], str | None] | None = None, when: str = CONFIGURE):
    """A dataclass field with its help text and the rules ``field_errors`` applies to it.

    ``minimum``: value >= minimum; ``above``: value > above; ``maximum``: value <= maximum (what
    the code can do: a timer period or a timeout in range, a scale that keeps points finite);
    ``check(value)`` returns an error text (without the field name) or None; ``when``:
    CONFIGURE, ACTIVATE or LIVE.
    """
    return dataclasses.field(default=default, metadata={
        "help": help, "choices": choices, "minimum": minimum, "above": above, "maximum": maximum,
        "check": check, "when": when})


def parse_image_size(text: str) -> tuple[int, int] | None:
    """'640x480' -> (640, 480); None if it is not two positive integers."""
    try:
        width, height = (int(v) for v in str(text).lower().split("x"))
    except ValueError:
        return None
    return (width, height) if width > 0 and height > 0 else None


def _warmup_image_size(value) -> str | None:
    from .warmup_size import AUTO   # the rule's module (it reads these settings)

    if value == AUTO:
        return None
    size = parse_image_size(value)
    if size is None:
        return f"must be {AUTO} or WIDTHxHEIGHT in pixels, e.g. 640x480"
    if size[0] * size[1] > DEFAULT_MAX_PIXELS:
        return f"must be at most {DEFAULT_MAX_PIXELS} pixels (larger images are refused as bad input)"
    return None


def _existing_file_or_empty(value) -> str | None:
    if value and not os.path.isfile(value):
        return "names a file that does not exist (set an existing .pt, or '' for random weights: not a map)"
    return None


def _model_config(value) -> str | None:
    if value.endswith(".json") and not os.path.isfile(value):
        return "names a JSON file that does not exist (or use a preset: tiny, lingbot-map)"
    return None


def _device(value) -> str | None:
    if value in ("auto", "cpu") or value == "cuda" or (value.startswith("cuda:") and value[5:].isdigit()):
        return None
    return "must be auto, cpu, cuda or cuda:N"


# The largest camera mount translation (metres): a camera on the robot, or on a very large one.
# One bound for the camera_mount setting and a mount from TF (ros/robot_link.py).
MAX_MOUNT_M = 100.0
# Voxel indices fit +-2^20 per axis (store/voxel_map.py): 1 mm voxels span +-1 km around the map's
# origin, the default 5 cm +-52 km. A smaller voxel cannot hold a robot's map (every keyframe's
# points would leave the key range: a model failure each).
MIN_VOXEL_SIZE_M = 1e-3
# Frames an attention cache may hold (anchors, window): the model's trained 3D-RoPE range
# (max_frame_num); the cache allocates a page per frame up front, on every layer.
MAX_CACHE_FRAMES = 1024


def _mount(value) -> str | None:
    try:
        numbers = [float(v) for v in value.split()]
    except ValueError:
        numbers = []
    if len(numbers) != 6 or not all(math.isfinite(v) for v in numbers):
        return "must be six numbers 'x y z roll pitch yaw' (metres, radians)"
    if max(abs(v) for v in numbers[:3]) > MAX_MOUNT_M:
        return f"must have a translation of at most {MAX_MOUNT_M:g} m per axis (a camera on the robot)"
    if max(abs(v) for v in numbers[3:]) > 2 * math.pi:
        return "must have angles of at most 2 pi radians in magnitude"
    return None


# Widest model input: 150 patches, 16 times the default's tokens per frame (and per cache page).
MAX_IMAGE_WIDTH = 2100
MAX_CAMERA_ITERATIONS = 64      # the camera head runs once per iteration in every frame step
# Frames between keyframes: the rollback keeps this many frames' bookkeeping, a window's length
# and overlap are counted in them.
MAX_KEYFRAME_INTERVAL = 1000


def _patch_multiple(value) -> str | None:
    return None if value >= 14 and value % 14 == 0 else "must be a positive multiple of 14 (the patch size)"


@dataclasses.dataclass(frozen=True)
class MapperSettings:
    # -- the model and its session --------------------------------------------------------------
    checkpoint: str = setting("", "model checkpoint (.pt); empty = random weights in the architecture model_config "
                                  "names (tiny if that is empty too; the start-up warning names it): NOT a real "
                                  "map", check=_existing_file_or_empty)
    model_config: str = setting("", "preset name (tiny, lingbot-map) or JSON file; empty = lingbot-map with "
                                    "a checkpoint, tiny without", check=_model_config)
    device: str = setting("auto", "auto, cpu, cuda or cuda:N", check=_device)
    dtype: str = setting("auto", "auto (bfloat16 on CUDA, float32 on the CPU), float32, float16 or bfloat16",
                         choices=("auto", *DTYPES))
    attention_backend: str = setting("auto", "auto, torch or flashinfer", choices=BACKENDS)
    kv_cache_dtype: str = setting("auto", "what the global KV cache stores: auto = the compute dtype; fp8 = "
                                          "float8 e4m3, half the pools' memory, attention still in the compute "
                                          "dtype over the rounded K/V (bench/README.md, issue 26)",
                                  choices=KV_CACHE_DTYPES)
    cuda_graphs: bool = setting(True, "replay each frame step as captured CUDA graphs (CUDA with flashinfer; "
                                      "same outputs, far less host work); false runs it eagerly")
    fused_blocks: bool = setting(True, "run the transformer blocks' norms, RoPE and residual work as kernels "
                                       "fused by torch.compile (CUDA, single-frame steps; compiled once at "
                                       "warm-up, cached on disk); false keeps the eager kernels")
    image_width: int = setting(518, f"model input width in pixels (multiple of the patch size, 14; at most "
                                    f"{MAX_IMAGE_WIDTH})", check=_patch_multiple, maximum=MAX_IMAGE_WIDTH)
    exact_resize: bool = setting(False, "resize with PIL bicubic on the CPU exactly as the original demo "
                                        "(default: antialiased bicubic on the model's device, faster)")
    warmup: bool = setting(True, "run dummy frames through both phases before the first real frame "
                                 "(kernel builds, CUDA graph capture) so that it is not slow")
    warmup_image_size: str = setting("auto", "camera image size the warm-up imitates, so that the cache built, "
                                             "the kernels compiled and the CUDA graph captured at warm-up serve "
                                             "the live frames: auto = the images' own where known before the first "
                                             "frame (the node: the camera_info beside the image topic, waited for "
                                             "warmup_camera_info_wait_s; the tools: the input's first image), else "
                                             "640x480; or WIDTHxHEIGHT", check=_warmup_image_size)
    # -- the stream (spec 9, 13) -----------------------------------------------------------------
    num_scale_frames: int = setting(8, "frames buffered and run together before the first poses (phase 1, "
                                       "scale initialisation)", minimum=1)
    scale_frames: int = setting(8, "anchor frames the attention cache keeps for the whole stream", minimum=0,
                                maximum=MAX_CACHE_FRAMES)
    sliding_window: int = setting(64, "keyframes kept in the attention cache's sliding window (scale_frames + "
                                      f"sliding_window at most {MAX_CACHE_FRAMES}, the model's max_frame_num: "
                                      "the cache allocates a page for each up front)", minimum=1,
                                  maximum=MAX_CACHE_FRAMES)
    camera_num_iterations: int = setting(4, "camera head refinement iterations", minimum=1,
                                         maximum=MAX_CAMERA_ITERATIONS)
    cross_frame_special: bool = setting(True, "evicted frames leave their special tokens in the cache "
                                              "(false: they vanish; spec 9)")
    include_scale_frames: bool = setting(True, "the anchor frames stay in the cache (false: no anchors; spec 9)")
    camera_only: bool = setting(False, "evicted frames leave only their camera token (spec 9)")
    # -- keyframes -------------------------------------------------------------------------------
    keyframe_policy: str = setting("interval", "interval (every keyframe_interval-th frame) or motion "
                                               "(optical-flow parallax against the last keyframe)",
                                   choices=KEYFRAME_POLICIES)
    keyframe_interval: int = setting(1, f"keyframe every N frames (interval policy; at most "
                                        f"{MAX_KEYFRAME_INTERVAL})", minimum=1, maximum=MAX_KEYFRAME_INTERVAL)
    keyframe_min_parallax_px: float = setting(8.0, "median optical-flow parallax (pixels at 320 px image "
                                                   "width) that makes a keyframe (motion policy)", minimum=0, when=LIVE)
    # -- long runs -------------------------------------------------------------------------------
    long_run_policy: str = setting("windowed", "windowed (windows of window_size keyframes, each from a fresh "
                                               "stream aligned to the previous one over overlap_size frames: "
                                               "bounded cost, one map frame), reset (restart the stream at "
                                               "max_keyframes / max_cache_mb; the map continues from the last "
                                               "pose at the new stream's own scale) or none (never: the cost "
                                               "per frame grows)", choices=LONG_RUN_POLICIES)
    window_size: int = setting(256, "windowed policy: keyframes per window, phase-1 frames included (spec 13.1)",
                               minimum=1)
    overlap_size: int = setting(16, "windowed policy: frames each window shares with the previous one and "
                                    "runs again to align to it (>= 1, below the window's length)", minimum=1)
    overlap_keyframes: int = setting(0, "windowed policy: if > 0, the overlap in keyframes instead "
                                        "(max(num_scale_frames, overlap_keyframes * keyframe_interval) "
                                        "frames; takes precedence over overlap_size)", minimum=0)
    window_alignment: str = setting("anchor", "windowed policy: anchor (the original's: rotation and "
                                              "translation from the newest paired keyframe) or all_frames "
                                              "(fitted over every overlap frame; bench/README.md measures "
                                              "it)", choices=ESTIMATORS)
    window_switch_ahead: bool = setting(False, "windowed policy: the next window's first overlap_size frames run "
                                               "ahead, each right after its own frame, in a spare session whose "
                                               "cache holds only them (2.5 GiB more at the peak in bf16, 1.8 GiB "
                                               "with fp8, released model at 518x378), so that the frame starting "
                                               "a window runs nothing again; same outputs "
                                               "(mapping/windows/ahead.py says what it needs)")
    max_keyframes: int = setting(1000, "reset policy: keyframes stored since the stream started before it "
                                       "restarts (0 = no cap); keep it below the model's max_frame_num "
                                       "(1024) so the 3D RoPE stays in its trained range", minimum=0, when=LIVE)
    max_cache_mb: float = setting(0.0, "reset policy: cache memory in use (MB) before the stream restarts "
                                       "(0 = no cap)", minimum=0, when=LIVE)
    # -- stamps ----------------------------------------------------------------------------------
    max_stamp_gap_s: float = setting(5.0, "a forward gap between image stamps larger than this restarts the "
                                          "stream and the map once the next frame follows the jump; a single "
                                          "frame that far ahead is refused (0 = never)", minimum=0, maximum=1e6,
                                     when=LIVE)
    max_stamp_jitter_s: float = setting(0.5, "a frame stamped at most this much before the previous one is "
                                             "dropped as jitter (counted as rejected); a larger jump back "
                                             "(a looped bag) restarts the stream and the map", minimum=0,
                                     maximum=1e6, when=LIVE)
    # -- the robot: camera mount and metric scale ----------------------------------------------
    camera_mount: str = setting("0 0 0 -1.5707963267948966 0 -1.5707963267948966",
                                "the camera's optical frame in the robot's base frame, 'x y z roll pitch yaw' "
                                f"(metres, radians; at most {MAX_MOUNT_M:g} m and 2 pi each), used where TF has no "
                                "base_frame -> image frame transform; the default: at the base, looking along its "
                                "x axis", check=_mount)
    scale_source: str = setting("none", "none (outputs in model units, up to scale), fixed (the scale "
                                        "setting) or odometry (estimated against the robot's odometry)",
                                choices=SCALE_SOURCES)
    scale: float = setting(1.0, "metres per model unit with scale_source fixed (1e-6 to 1e6)", minimum=1e-6,
                           maximum=1e6)
    scale_window_pairs: int = setting(50, "odometry scale: keyframe pairs in the sliding estimate", minimum=1)
    scale_min_pairs: int = setting(10, "odometry scale: pairs before the scale counts as known", minimum=1)
    scale_min_motion_m: float = setting(0.2, "odometry scale: odometry motion (m) that closes a pair "
                                             "(standing still and turning in place give none)", above=0)
    scale_max_spread: float = setting(0.02, "odometry scale: largest relative standard error of a known "
                                            "scale", above=0)
    scale_update_step: float = setting(0.01, "odometry scale, once known: the applied scale follows the estimate "
                                             "only when they differ by more than this fraction, and then by at "
                                             "most this fraction per keyframe (0 = frozen once known)",
                                       minimum=0, maximum=1)
    # -- map and trajectory ----------------------------------------------------------------------
    min_confidence: float = setting(1.5, "minimum depth confidence of map and published points (the model's "
                                         "confidence is 1 + exp(x) > 1: any value up to 1 keeps every point)",
                                    minimum=0, when=LIVE)
    map_points_stride: int = setting(4, "pixel stride (both image axes) of the keyframe points put into the "
                                        "map", minimum=1, when=LIVE)
    map_voxel_size_m: float = setting(0.05, "voxel size of the map, metres (model units until the scale is "
                                            "known); the map spans 2^20 voxels each way from its origin (52 km "
                                            f"at 5 cm, 1 km at the smallest, {MIN_VOXEL_SIZE_M * 1000:g} mm)",
                                      minimum=MIN_VOXEL_SIZE_M)
    max_map_points: int = setting(2_000_000, "map size bound; the least recently updated voxels go first",
                                  minimum=1)
    max_trajectory_poses: int = setting(1_000_000, "poses kept in the saved trajectory; the oldest go first "
                                                   "once it is full (warned once)", minimum=1)
    # -- the map database (mapping/database/schema.py) ------------------------------------------------
    map_database: str = setting("$ROS_HOME/lingbot_ros/map.db",
                                "SQLite file the map, trajectory and windows are written to while mapping, one "
                                "run per configure ($ROS_HOME: ROS_HOME, else ~/.ros); empty = off")
    map_database_commit_s: float = setting(1.0, "map database: the writer commits at least this often (a crash "
                                                "loses at most this much of the run)", above=0)
    map_database_continuation_s: float = setting(
        30.0, "map database: a windowed run stores what a resume continues from (the newest overlap_size "
              "frames' images and results) at most this often, so a run resumed after a crash aligns to "
              "them; 0 = only at a clean end (README: The map database)", minimum=0)
    map_database_images: bool = setting(True, "map database: store each keyframe's image (JPEG, about 0.4 bytes "
                                               "per pixel) for lingbot-ros-map export --format colmap; false = "
                                               "poses and map only")
    map_database_max_runs: int = setting(0, "map database: runs kept, the oldest deleted when a run starts "
                                            "(0 = all)", minimum=0)
    resume: bool = setting(False, "at configure, continue the map database's last run in the same map frame: "
                                  "its map, trajectory and windows, the next window aligned to its last frames "
                                  "(README: The map database)")
    map_database_max_mb: float = setting(0.0, "map database: the oldest runs are deleted when a run starts "
                                              "while the file holds more than this (MB; 0 = no limit)", minimum=0)

    def __post_init__(self):
        from .settings_rules import cross_field_errors   # the rules' module reads this one's bounds

        errors = field_errors(self)
        if not errors:
            errors = cross_field_errors(self)
        if errors:
            raise SettingsError("invalid settings: " + "; ".join(errors))

    def window_rule(self):
        """The windowed policy's WindowRule (spec 13.1)."""
        from .windows.rule import WindowRule

        return WindowRule(self.window_size, self.num_scale_frames, self.keyframe_interval,
                          overlap_size=None if self.overlap_keyframes else self.overlap_size,
                          overlap_keyframes=self.overlap_keyframes or None)


def field_errors(obj) -> list[str]:
    """Errors of every field of a settings dataclass against its ``setting`` rules."""
    errors = []
    for f in dataclasses.fields(obj):
        value, meta = getattr(obj, f.name), f.metadata
        expected = type(f.default)
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            errors.append(f"'{f.name}' must be a {expected.__name__}, got {value!r}")
            continue
        if isinstance(value, float) and not math.isfinite(value):
            errors.append(f"'{f.name}' must be a finite number, got {value}")
            continue
        if meta.get("choices") and value not in meta["choices"]:
            errors.append(f"'{f.name}' must be one of {list(meta['choices'])}, got {value!r}")
        if meta.get("minimum") is not None and value < meta["minimum"]:
            errors.append(f"'{f.name}' must be >= {meta['minimum']}, got {value}")
        if meta.get("above") is not None and not value > meta["above"]:
            errors.append(f"'{f.name}' must be > {meta['above']}, got {value}")
        if meta.get("maximum") is not None and value > meta["maximum"]:
            errors.append(f"'{f.name}' must be <= {meta['maximum']:g}, got {value}")
        if meta.get("check") is not None:
            text = meta["check"](value)
            if text:
                errors.append(f"'{f.name}' {text}, got {value!r}")
    return errors


def integer_for_float(field: dataclasses.Field, value) -> bool:
    """An int given where the setting is a float (a YAML 2, a flag, a ROS parameter): taken as 2.0."""
    return type(field.default) is float and isinstance(value, int) and not isinstance(value, bool)


def coerce(cls, values: Mapping[str, Any]):
    """``cls(**values)`` for a settings dataclass, after the lenient conversions a YAML file or a
    command line needs (an int where a float is expected). Unknown names are errors; every
    problem is reported at once as a SettingsError."""
    names = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(names))
    kwargs = {name: float(value) if name in names and integer_for_float(names[name], value) else value
              for name, value in values.items()}
    if unknown:
        raise SettingsError(f"invalid settings: unknown name(s) {unknown}")
    return cls(**{k: v for k, v in kwargs.items() if k in names})
