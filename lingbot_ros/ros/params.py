"""Every parameter of map_node, declared in one place and validated at configure.

``PARAMETERS`` is the single list (name, default, description). ``declare(node)`` declares them
all (dynamically typed, so a YAML ``2`` for a float is accepted and a wrong type is reported by
``validate`` instead of killing the node at start-up). ``read(node)`` returns a ``NodeConfig`` or
raises ``ConfigError`` listing every problem with the parameter name and what to change.
config/map.yaml mirrors these defaults.
"""
from __future__ import annotations

import dataclasses
import math
import os

from lingbot_ros.io.image_codec import DEFAULT_MAX_PIXELS

QOS_CHOICES = ("sensor_data", "reliable", "best_effort")
KEYFRAME_POLICIES = ("interval", "motion")
TF_MODES = ("none", "map_to_camera", "map_to_odom")
CACHE_FULL_ACTIONS = ("reset",)


@dataclasses.dataclass(frozen=True)
class NodeConfig:
    autostart: bool = True
    # Model
    checkpoint: str = ""
    model_config: str = ""
    device: str = "auto"
    image_width: int = 518
    num_scale_frames: int = 8
    sliding_window: int = 64
    camera_num_iterations: int = 4
    dtype: str = "auto"
    attention_backend: str = "auto"
    cuda_graphs: bool = True
    fused_blocks: bool = True
    warmup: bool = True
    warmup_image_size: str = "640x480"
    # Keyframes and long runs
    keyframe_policy: str = "interval"
    keyframe_interval: int = 1
    keyframe_min_parallax_px: float = 8.0
    max_keyframes: int = 1000
    max_cache_mb: float = 0.0
    on_cache_full: str = "reset"
    max_stamp_gap_s: float = 5.0
    # Input
    image_transport: str = "raw"
    process_all_frames: bool = False
    queue_size: int = 30
    image_qos: str = "sensor_data"
    image_qos_depth: int = 1
    camera_info_qos: str = "sensor_data"
    camera_info_qos_depth: int = 5
    use_camera_info: bool = False
    max_image_pixels: int = DEFAULT_MAX_PIXELS
    # Output
    map_frame: str = "map"
    camera_frame: str = ""
    tf_mode: str = "none"
    tf_camera_frame: str = "lingbot_camera"
    odom_frame: str = "odom"
    odom_variance: float = 0.01
    path_max_length: int = 1000
    points_stride: int = 4
    min_confidence: float = 1.5
    map_voxel_size_m: float = 0.05
    map_publish_period_s: float = 2.0
    save_directory: str = "out"
    diagnostics_period_s: float = 1.0
    service_timeout_s: float = 30.0


DESCRIPTIONS = {
    "autostart": "configure and activate at start-up (off: wait for lifecycle transitions)",
    "checkpoint": "model checkpoint (.pt); empty = tiny random-weight model, NOT a real map",
    "model_config": "preset name (tiny, lingbot-map) or JSON file; empty = lingbot-map with a "
                    "checkpoint, tiny without",
    "device": "auto, cpu, cuda or cuda:N",
    "image_width": "model input width in pixels (multiple of the patch size, 14)",
    "num_scale_frames": "frames buffered before the first poses (scale initialisation)",
    "sliding_window": "keyframes kept in the attention window",
    "camera_num_iterations": "camera head refinement iterations",
    "dtype": "auto, float32, float16 or bfloat16",
    "attention_backend": "auto, torch or flashinfer",
    "cuda_graphs": "replay each frame step as captured CUDA graphs (CUDA with flashinfer; same outputs, "
                   "far less host work); false runs it eagerly",
    "fused_blocks": "run the transformer blocks' norms, RoPE and residual work as kernels fused by torch.compile "
                    "(CUDA, single-frame steps; compiled once at warm-up, cached on disk); false keeps the eager kernels",
    "warmup": "run dummy frames through both phases at activate (kernel builds, CUDA graph capture) "
              "so the first real frames are not slow",
    "warmup_image_size": "camera image size (WxH) the warm-up imitates: set it to the camera's, so that the "
                         "kernels compiled and the CUDA graph captured at warm-up serve the live frames",
    "keyframe_policy": "interval (every keyframe_interval-th frame) or motion (optical-flow "
                       "parallax against the last keyframe)",
    "keyframe_interval": "keyframe every N frames (interval policy)",
    "keyframe_min_parallax_px": "median optical-flow parallax (pixels at 320 px image width) that makes a keyframe (motion policy)",
    "max_keyframes": "keyframes stored since the last reset before on_cache_full (0 = no cap); keep it below the model's max_frame_num (1024) so the 3D RoPE stays in range",
    "max_cache_mb": "cache memory before on_cache_full (0 = no cap)",
    "on_cache_full": "what happens at the cap: reset (the stream restarts, announced on ~/status)",
    "max_stamp_gap_s": "a gap between image stamps larger than this resets the stream (0 = never); "
                       "a backward jump always does",
    "image_transport": "raw (~/image, sensor_msgs/Image) or compressed (~/image/compressed)",
    "process_all_frames": "process every frame in order with a bounded queue (bag replay) instead "
                          "of newest-frame-wins",
    "queue_size": "queue bound with process_all_frames (the subscription then waits)",
    "image_qos": "sensor_data, reliable or best_effort",
    "image_qos_depth": "image subscription history depth",
    "camera_info_qos": "sensor_data, reliable or best_effort",
    "camera_info_qos_depth": "camera_info subscription history depth",
    "use_camera_info": "subscribe to ~/camera_info (validated; its K is reported in diagnostics "
                       "next to the model's estimate)",
    "max_image_pixels": "larger images are rejected as bad input",
    "map_frame": "frame of poses, path, odometry, clouds",
    "camera_frame": "child frame of odometry and frame of depth images; empty = the image's frame_id",
    "tf_mode": "none, map_to_camera (map -> tf_camera_frame) or map_to_odom (needs tf2_ros)",
    "tf_camera_frame": "child frame for tf_mode map_to_camera; must be a frame no other node "
                       "publishes",
    "odom_frame": "odometry frame for tf_mode map_to_odom",
    "odom_variance": "pose covariance diagonal while tracking",
    "path_max_length": "poses kept in ~/path",
    "points_stride": "pixel stride of ~/points and of map insertion",
    "min_confidence": "minimum depth confidence of published points",
    "map_voxel_size_m": "voxel size of the accumulated map",
    "map_publish_period_s": "period of ~/map (0 = never published)",
    "save_directory": "default directory of ~/save_map",
    "diagnostics_period_s": "period of /diagnostics and of the periodic ~/status",
    "service_timeout_s": "how long a service waits for the worker",
}

PARAMETERS = [(f.name, f.default, DESCRIPTIONS[f.name]) for f in dataclasses.fields(NodeConfig)]


class ConfigError(ValueError):
    """Invalid parameters; the message lists each one and what to change."""


def declare(node) -> None:
    from rcl_interfaces.msg import ParameterDescriptor

    for name, default, description in PARAMETERS:
        if not node.has_parameter(name):
            node.declare_parameter(name, default, ParameterDescriptor(
                description=description, dynamic_typing=True))


def parse_image_size(text: str) -> tuple[int, int] | None:
    """'640x480' -> (640, 480); None if it is not two positive integers."""
    try:
        width, height = (int(v) for v in text.lower().split("x"))
    except ValueError:
        return None
    return (width, height) if width > 0 and height > 0 else None


def read(node) -> NodeConfig:
    return validate({name: node.get_parameter(name).value for name, _, _ in PARAMETERS})


def _coerce(name, value, default, errors):
    expected = type(default)
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
        errors.append(f"'{name}' must be a {expected.__name__}, got {value!r}")
        return default
    return value


def validate(values: dict) -> NodeConfig:
    """Check types and ranges; raise ConfigError naming every bad parameter."""
    errors: list[str] = []
    defaults = NodeConfig()
    unknown = sorted(set(values) - {f.name for f in dataclasses.fields(NodeConfig)})
    if unknown:
        errors.append(f"unknown parameter(s) {unknown}")
    kwargs = {f.name: _coerce(f.name, values.get(f.name, getattr(defaults, f.name)),
                              getattr(defaults, f.name), errors)
              for f in dataclasses.fields(NodeConfig)}
    cfg = NodeConfig(**kwargs)

    def need(ok: bool, message: str):
        if not ok:
            errors.append(message)

    def choice(name, choices):
        need(getattr(cfg, name) in choices, f"'{name}' must be one of {list(choices)}, got "
                                            f"'{getattr(cfg, name)}'")

    for name in ("image_qos", "camera_info_qos"):
        choice(name, QOS_CHOICES)
    choice("keyframe_policy", KEYFRAME_POLICIES)
    choice("image_transport", ("raw", "compressed"))
    choice("tf_mode", TF_MODES)
    choice("on_cache_full", CACHE_FULL_ACTIONS)
    choice("dtype", ("auto", "float32", "float16", "bfloat16"))
    choice("attention_backend", ("auto", "torch", "flashinfer"))
    need(cfg.device == "auto" or cfg.device == "cpu" or cfg.device.startswith("cuda"),
         f"'device' must be auto, cpu, cuda or cuda:N, got '{cfg.device}'")
    for name in ("keyframe_interval", "image_qos_depth", "camera_info_qos_depth", "queue_size",
                 "points_stride", "num_scale_frames", "sliding_window", "camera_num_iterations",
                 "path_max_length"):
        need(getattr(cfg, name) >= 1, f"'{name}' must be >= 1, got {getattr(cfg, name)}")
    need(cfg.image_width >= 14 and cfg.image_width % 14 == 0,
         f"'image_width' must be a positive multiple of 14 (the patch size), got {cfg.image_width}")
    need(parse_image_size(cfg.warmup_image_size) is not None,
         f"'warmup_image_size' must be WIDTHxHEIGHT in pixels, e.g. 640x480, got '{cfg.warmup_image_size}'")
    need(cfg.max_keyframes >= 0, f"'max_keyframes' must be >= 0, got {cfg.max_keyframes}")
    need(cfg.max_image_pixels > 0, f"'max_image_pixels' must be > 0, got {cfg.max_image_pixels}")
    for name in ("keyframe_min_parallax_px", "max_cache_mb", "max_stamp_gap_s", "odom_variance",
                 "min_confidence", "map_publish_period_s"):
        value = getattr(cfg, name)
        need(math.isfinite(value) and value >= 0, f"'{name}' must be a finite number >= 0, got {value}")
    need(math.isfinite(cfg.map_voxel_size_m) and cfg.map_voxel_size_m > 0,
         f"'map_voxel_size_m' must be > 0, got {cfg.map_voxel_size_m}")
    need(math.isfinite(cfg.diagnostics_period_s) and cfg.diagnostics_period_s > 0,
         f"'diagnostics_period_s' must be a finite number > 0, got {cfg.diagnostics_period_s}")
    need(cfg.service_timeout_s > 0, f"'service_timeout_s' must be > 0, got {cfg.service_timeout_s}")
    need(bool(cfg.map_frame), "'map_frame' must not be empty")
    need(cfg.tf_mode != "map_to_camera" or bool(cfg.tf_camera_frame),
         "'tf_camera_frame' must name a frame when tf_mode is map_to_camera")
    need(cfg.tf_camera_frame != cfg.map_frame, "'tf_camera_frame' must differ from 'map_frame'")
    if cfg.checkpoint:
        need(os.path.isfile(cfg.checkpoint), f"'checkpoint' file '{cfg.checkpoint}' does not exist "
                                             "(set an existing .pt, or '' for the tiny random model)")
    if cfg.model_config.endswith(".json"):
        need(os.path.isfile(cfg.model_config),
             f"'model_config' file '{cfg.model_config}' does not exist")
    if errors:
        raise ConfigError("invalid parameters: " + "; ".join(errors))
    return cfg
