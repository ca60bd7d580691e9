"""map_node's parameters: the Mapper's settings plus the node's own, declared from one list.

Every field of ``MapperSettings`` and ``NodeSettings`` is one parameter of the same name, with
the field's default and help text. Descriptors say when a value may change (mapping.settings):
CONFIGURE fields are read-only, ACTIVATE fields (the inputs) may change while the node is
inactive and take effect at activate, LIVE fields apply at once. Integer and float minimums
become descriptor ranges. Parameters are dynamically typed so that a YAML ``2`` for a float is
accepted and a wrong type is reported at configure instead of killing the node at start-up.
"""
from __future__ import annotations

import dataclasses
import sys

from lingbot_ros.io.image_codec import DEFAULT_MAX_PIXELS
from lingbot_ros.mapping.placement.odometry import MAX_AGE_S as ODOMETRY_MAX_AGE_S
from lingbot_ros.mapping.rig.grouping import MAX_CAMERAS, GroupingSettings
from lingbot_ros.mapping.settings import (ACTIVATE, CONFIGURE, LIVE, MapperSettings, SettingsError, coerce,
                                          field_errors, integer_for_float, setting)
from lingbot_ros.viewer.live_view import DEFAULT_POINT_BUDGET as VIEWER_POINT_BUDGET

QOS_CHOICES = ("sensor_data", "reliable", "best_effort")
IMAGE_QOS_CHOICES = ("auto",) + QOS_CHOICES
TF_MODES = ("none", "map_to_odom", "map_to_base", "map_to_camera")
ODOMETRY_SOURCES = ("topic", "tf")
IMAGE_TRANSPORTS = ("raw", "compressed")


def _frame_name(value) -> str | None:
    return None if value and "/" not in value.strip("/") and " " not in value else \
        "must be a TF frame name (non-empty, no spaces or inner slashes)"


def _frame_name_or_empty(value) -> str | None:
    return _frame_name(value) if value else None


def _period(shortest_s: float):
    """A timer period's rule: 0 (off) or at least ``shortest_s`` (a shorter timer busy-spins, or
    floods its topic)."""
    def check(value) -> str | None:
        return None if value == 0 or value >= shortest_s else f"must be 0 (off) or at least {shortest_s:g} s"
    return check


def _below_1(value) -> str | None:
    return None if value < 1 else "must be below 1"


def _port(value) -> str | None:
    return None if value == 0 or value >= 1024 else "must be 0 (off) or at least 1024 (lower ports need root)"


def _not_empty(value) -> str | None:
    return None if value.strip() else "must name a directory (empty would write into the working directory)"


# Longest timer period and wait a parameter may ask for: far beyond any use, and well inside
# what rclpy timers (int64 nanoseconds) and threading waits (TIMEOUT_MAX) take.
MAX_PERIOD_S = 86400.0
MAX_DEPTH = 100_000
# Shortest timer periods: map -> odom republished at up to 1 kHz, ~/map ticks at up to 1 kHz
# (its publications coalesce on the worker), /diagnostics at up to 20 Hz. Shorter ones busy-spin
# the executor (a 1e-12 s period is a 0 ns timer) or flood their topic.
MIN_PERIOD_S = 0.001
MIN_DIAGNOSTICS_PERIOD_S = 0.05
# /diagnostics keeps one sample of the counts per period over its window: an hour at 20 Hz is
# 72,000 of them.
MAX_DIAGNOSTICS_WINDOW_S = 3600.0
MAX_QUEUED_FRAMES = 1000
# Configure's wait for a camera_info (warmup_image_size auto): a camera publishes one a frame.
MAX_CAMERA_INFO_WAIT_S = 30.0
# The live view's sample of the map: 200,000 points are ~2 MB a refresh; 5 million is what a
# browser still draws.
MAX_VIEWER_POINTS = 5_000_000


_GROUPING = {f.name: f for f in dataclasses.fields(GroupingSettings)}


@dataclasses.dataclass(frozen=True)
class NodeSettings:
    autostart: bool = setting(True, "configure and activate at start-up (off: wait for lifecycle transitions)")
    # -- input (taken at activate) ---------------------------------------------------------------
    image_transport: str = setting("raw", "raw (~/image, sensor_msgs/Image) or compressed (<image "
                                          "topic>/compressed, sensor_msgs/CompressedImage)",
                                   choices=IMAGE_TRANSPORTS, when=ACTIVATE)
    process_all_frames: bool = setting(False, "process every frame in order (bag replay): a reliable "
                                              "keep-all subscription and a bounded queue that makes the "
                                              "publisher wait, instead of newest-frame-wins", when=ACTIVATE)
    queue_size: int = setting(30, "queue bound with process_all_frames (the subscription then waits); at most "
                                  f"{MAX_QUEUED_FRAMES}: each queued frame is a decoded image (0.9 MB at 640x480)",
                              minimum=1, maximum=MAX_QUEUED_FRAMES, when=ACTIVATE)
    image_qos: str = setting("auto", "auto (sensor_data; reliable keep-all with process_all_frames), "
                                     "sensor_data, reliable or best_effort", choices=IMAGE_QOS_CHOICES,
                             when=ACTIVATE)
    image_qos_depth: int = setting(1, "image subscription history depth (newest-frame-wins)", minimum=1,
                                   maximum=MAX_DEPTH, when=ACTIVATE)
    use_camera_info: bool = setting(False, "subscribe to the camera_info beside the image topic (validated; "
                                           "its K is reported in diagnostics next to the model's estimate)",
                                    when=ACTIVATE)
    camera_info_qos: str = setting("sensor_data", "sensor_data, reliable or best_effort", choices=QOS_CHOICES,
                                   when=ACTIVATE)
    camera_info_qos_depth: int = setting(5, "camera_info subscription history depth", minimum=1, maximum=MAX_DEPTH,
                                         when=ACTIVATE)
    warmup_camera_info_wait_s: float = setting(1.0, "with warmup_image_size auto: how long configure waits for "
                                                    "a camera_info beside the image topic (camera_info_qos) to "
                                                    "warm up on its image size; none in time: 640x480 (0 = do "
                                                    f"not wait; at most {MAX_CAMERA_INFO_WAIT_S:g} s)", minimum=0,
                                               maximum=MAX_CAMERA_INFO_WAIT_S)
    max_input_ahead_s: float = setting(5.0, "odometry stamped further than this ahead of the image clock (the "
                                            "newest image's stamp plus the time since it came) is refused: "
                                            "it would make every later sample look too old (at most the "
                                            f"{ODOMETRY_MAX_AGE_S:g} s the odometry buffer keeps)", above=0,
                                       maximum=ODOMETRY_MAX_AGE_S, when=ACTIVATE)
    max_image_pixels: int = setting(DEFAULT_MAX_PIXELS, "larger images are rejected as bad input", minimum=1,
                                    when=ACTIVATE)
    strict_jpeg: bool = setting(True, "a JPEG libjpeg warns about (damaged data, bytes before its end) is "
                                "rejected; false accepts them, for a camera whose every JPEG carries such "
                                "a warning (damaged frames then reach the map)", when=ACTIVATE)
    # -- a camera rig (issue 29) -----------------------------------------------------------------
    # The help texts and bounds of the sync settings are grouping.py's (one rule, one place).
    cameras: tuple = setting((), f"a camera rig: 1 to {MAX_CAMERAS} camera names in order (letters, digits and "
                                 "single underscores, starting with a letter; empty = one camera on ~/image, as "
                                 "always). Camera <name> reads ~/<name>/image (~/<name>/image/compressed, "
                                 "~/<name>/camera_info) and publishes ~/<name>/pose and ~/<name>/depth/image; "
                                 "one name is a rig of one camera on those topics")
    primary_camera: str = setting("", "with cameras: the camera whose poses are ~/pose, ~/odom, ~/path and TF, and "
                                      "whose scale the map takes (empty = the first)")
    camera_sync_tolerance_s: float = setting(
        _GROUPING["camera_sync_tolerance_s"].default, "with cameras: "
        + _GROUPING["camera_sync_tolerance_s"].metadata["help"], minimum=0,
        maximum=_GROUPING["camera_sync_tolerance_s"].metadata["maximum"], when=ACTIVATE)
    camera_sync_wait_s: float = setting(
        _GROUPING["camera_sync_wait_s"].default, "with cameras: " + _GROUPING["camera_sync_wait_s"].metadata["help"],
        minimum=0, maximum=_GROUPING["camera_sync_wait_s"].metadata["maximum"], when=ACTIVATE)
    # -- output ----------------------------------------------------------------------------------
    map_frame: str = setting("map", "frame of poses, path, odometry and clouds", check=_frame_name)
    base_frame: str = setting("base_link", "the robot's base frame: ~/pose, ~/odom and ~/path are its poses, "
                                           "and the camera mount is looked up as base_frame -> the image's "
                                           "frame_id", check=_frame_name)
    camera_frame: str = setting("", "frame_id of the depth and confidence images and their camera_info; "
                                    "empty = the input image's frame_id", check=_frame_name_or_empty)
    tf_mode: str = setting("none", "none, map_to_odom (REP 105: map -> odom_frame from the robot's "
                                   "odometry), map_to_base (map -> base_frame, a robot without other "
                                   "odometry) or map_to_camera (map -> tf_camera_frame)", choices=TF_MODES)
    odometry_source: str = setting("topic", "the robot's odometry (map_to_odom, scale_source odometry): "
                                            "topic (~/odometry_in, nav_msgs/Odometry) or tf (odom_frame -> "
                                            "base_frame; needs tf2_ros)", choices=ODOMETRY_SOURCES)
    tf_camera_frame: str = setting("lingbot_camera", "child frame for tf_mode map_to_camera; must be a frame "
                                                     "no other node publishes", check=_frame_name)
    odom_frame: str = setting("odom", "the robot's odometry frame (tf_mode map_to_odom)", check=_frame_name)
    transform_publish_period_s: float = setting(0.05, "tf_mode map_to_odom: the newest map -> odom is published "
                                                      "again at this period, post-dated by transform_timeout_s "
                                                      "(as slam_toolbox's transform_publish_period), so a lookup "
                                                      "at 'now' succeeds between frames (0 = only at each image's "
                                                      f"stamp; else at least {MIN_PERIOD_S:g} s)", minimum=0,
                                                maximum=MAX_PERIOD_S, check=_period(MIN_PERIOD_S))
    transform_timeout_s: float = setting(0.2, "how far ahead of now the republished map -> odom is stamped (as "
                                              "slam_toolbox's transform_timeout)", minimum=0, maximum=MAX_PERIOD_S)
    odom_variance: float = setting(0.01, "pose covariance diagonal of ~/odom while tracking (1e6 while the "
                                         "pose is not to be fused)", minimum=0,
                                   when=LIVE)
    path_max_length: int = setting(1000, "poses in ~/path", minimum=1, when=LIVE)
    points_stride: int = setting(4, "pixel stride of ~/points", minimum=1, when=LIVE)
    map_publish_period_s: float = setting(2.0, f"period of ~/map (0 = never published; else at least "
                                               f"{MIN_PERIOD_S:g} s)", minimum=0, maximum=MAX_PERIOD_S,
                                          check=_period(MIN_PERIOD_S), when=LIVE)
    viewer_port: int = setting(0, "serve the live 3D view (the map's points, the trajectory, the newest camera) "
                                  "on http://127.0.0.1:<port> (0 = off; needs viser: pip install "
                                  "'lingbot_ros[viewer]'); a port in use is refused with an error and mapping goes "
                                  "on without the view", minimum=0, maximum=65535, check=_port)
    viewer_point_budget: int = setting(VIEWER_POINT_BUDGET, "most map points the live view sends (an even sample "
                                                            "of the map)", minimum=1, maximum=MAX_VIEWER_POINTS)
    save_directory: str = setting("lingbot_maps", "directory of ~/save_map; a relative one is under $ROS_HOME "
                                                  "(default ~/.ros), and a save_map request's relative directory "
                                                  "is under it", check=_not_empty, when=LIVE)
    diagnostics_period_s: float = setting(1.0, "period of /diagnostics and of the periodic ~/status",
                                          minimum=MIN_DIAGNOSTICS_PERIOD_S, maximum=3600.0, when=LIVE)
    service_timeout_s: float = setting(30.0, "how long a service, or a live change of a Mapper parameter, "
                                             "waits for the worker to start it (not started by then: cancelled, "
                                             "nothing done)", above=0,
                                       maximum=MAX_PERIOD_S, when=LIVE)
    # -- health (/diagnostics levels) -------------------------------------------------------------
    diagnostics_window_s: float = setting(5.0, "sliding window of /diagnostics' counts and rates: a drop, a "
                                               "bad input or a model failure sets the level for this long",
                                          above=0, maximum=MAX_DIAGNOSTICS_WINDOW_S, when=LIVE)
    stale_after_s: float = setting(3.0, "while active, /diagnostics is STALE when no image arrived for this "
                                        "long (0 = never)", minimum=0, maximum=MAX_PERIOD_S, when=LIVE)
    expected_rate_hz: float = setting(0.0, "the camera's frame rate: /diagnostics warns when images arrive "
                                           "outside rate_tolerance of it (0 = unknown: the rate is only "
                                           "reported)", minimum=0, when=LIVE)
    rate_tolerance: float = setting(0.1, "relative tolerance of expected_rate_hz, and of the processed rate "
                                         "against the input rate", minimum=0, check=_below_1, when=LIVE)

    def __post_init__(self):
        if isinstance(self.cameras, list):   # a ROS string array or a YAML list
            object.__setattr__(self, "cameras", tuple(self.cameras))
        errors = field_errors(self) + self.frame_errors() + self.rig_errors()
        if errors:
            raise SettingsError("invalid parameters: " + "; ".join(errors))

    def frame_errors(self) -> list[str]:
        """The frames the node names must be distinct: map, odom and base are three frames of
        REP 105 (odometry would be the pose of a frame in itself), the published camera is a child
        frame of its own, and the depth images are in the camera's optical frame, none of them."""
        errors = []
        names = ("map_frame", "base_frame", "odom_frame", "tf_camera_frame")
        for i, name in enumerate(names):
            for other in names[:i]:
                if getattr(self, name).strip("/") == getattr(self, other).strip("/"):
                    errors.append(f"'{name}' must differ from '{other}' (both '{getattr(self, name)}'): set "
                                  "another frame name")
        if self.camera_frame.strip("/") in {getattr(self, name).strip("/") for name in names[:3]}:
            errors.append(f"'camera_frame' ('{self.camera_frame}') must not be map_frame, odom_frame or "
                          "base_frame: the depth images are in the camera's optical frame (empty = the "
                          "input image's frame_id)")
        return errors

    def rig_errors(self) -> list[str]:
        """The cameras and the primary camera (ros/cameras.py, on the rig's own rule)."""
        if not isinstance(self.cameras, tuple) or not isinstance(self.primary_camera, str):
            return []   # field_errors said so
        if not self.cameras:
            return [f"'primary_camera' ({self.primary_camera!r}) needs cameras: set cameras, or primary_camera "
                    "to ''"] if self.primary_camera else []
        if self.camera_frame:
            return [f"'camera_frame' ({self.camera_frame!r}) would be every camera's depth frame: with cameras it "
                    "must be '' (each camera's depth is in its own image's frame_id)"]
        from lingbot_ros.ros.cameras import cameras_errors   # here: it imports topics, which imports this

        return cameras_errors(self.cameras, self.primary_camera)

    def grouping(self) -> GroupingSettings:
        """How the rig's frames are grouped (cameras set)."""
        return GroupingSettings(cameras=self.cameras, camera_sync_tolerance_s=self.camera_sync_tolerance_s,
                                camera_sync_wait_s=self.camera_sync_wait_s,
                                process_all_frames=self.process_all_frames, queue_size=self.queue_size)

    def input_errors(self) -> list[str]:
        """Combinations of input parameters that cannot work (checked at activate)."""
        if self.process_all_frames and self.image_qos not in ("auto", "reliable"):
            return [f"'process_all_frames' promises that no frame is lost, which a best-effort "
                    f"subscription cannot keep: set image_qos to auto or reliable (got "
                    f"'{self.image_qos}') or process_all_frames to false"]
        return []


PARAMETER_CLASSES = (MapperSettings, NodeSettings)
FIELDS = {f.name: f for cls in PARAMETER_CLASSES for f in dataclasses.fields(cls)}


def when(name: str) -> str:
    return FIELDS[name].metadata.get("when", CONFIGURE)


def descriptor(field):
    from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor

    meta = field.metadata
    text = meta["help"]
    if meta.get("choices"):
        text += f" [one of: {', '.join(meta['choices'])}]"
    stage = meta.get("when", CONFIGURE)
    text += {CONFIGURE: " (read-only: restart the node to change it)",
             ACTIVATE: " (taken at activate: change it while inactive)", LIVE: " (applies at once)"}[stage]
    result = ParameterDescriptor(description=text, dynamic_typing=True, read_only=stage == CONFIGURE)
    low = meta.get("minimum") if meta.get("minimum") is not None else meta.get("above")
    high = meta.get("maximum")
    if low is not None and type(field.default) is int:
        result.integer_range = [IntegerRange(from_value=int(low), to_value=int(high) if high is not None
                                             else 2**63 - 1, step=0)]
    elif low is not None and type(field.default) is float:
        result.floating_point_range = [FloatingPointRange(
            from_value=float(low), to_value=float(high) if high is not None else sys.float_info.max, step=0.0)]
    return result


def declare(node) -> dict:
    """Declare every parameter. A start-up value that its descriptor's range refuses does not
    kill the node: the default is declared instead, and the refused values are returned for
    ``read`` to report at configure, with the same messages as every other bad value."""
    from rclpy.exceptions import InvalidParameterValueException

    refused = {}
    for name, field in FIELDS.items():
        if node.has_parameter(name):
            continue
        try:
            override = node._parameter_overrides.get(name)
            if override is not None and integer_for_float(field, override.value):
                # A YAML 2 for a float parameter: declared as 2.0, so that it stays a float.
                node.declare_parameter(name, float(override.value), descriptor(field), ignore_override=True)
            else:
                node.declare_parameter(name, field.default, descriptor(field))
        except InvalidParameterValueException:
            refused[name] = node._parameter_overrides[name].value
            node.declare_parameter(name, field.default, descriptor(field), ignore_override=True)
    return refused


def read(node, refused: dict) -> tuple[MapperSettings, NodeSettings]:
    """The current parameter values as settings; SettingsError names every bad one."""
    values = {name: node.get_parameter(name).value for name in FIELDS}
    return split({**values, **refused})


def split(values: dict) -> tuple[MapperSettings, NodeSettings]:
    """Settings from a flat {name: value} (parameters, a YAML file), every problem at once."""
    unknown = sorted(set(values) - set(FIELDS))
    errors = [f"unknown parameter(s) {unknown}"] if unknown else []
    parts = []
    for cls in PARAMETER_CLASSES:
        names = {f.name for f in dataclasses.fields(cls)}
        try:
            parts.append(coerce(cls, {k: v for k, v in values.items() if k in names}))
        except SettingsError as error:
            errors.append(str(error).split(": ", 1)[1])
    if errors:
        raise SettingsError("invalid parameters: " + "; ".join(errors))
    return parts[0], parts[1]


def on_set(node, parameters):
    """Set-parameters callback: refuse what cannot change now (with the reason), check every new
    value against its rules, and apply LIVE values (Mapper ones on the worker, between frames)."""
    from rcl_interfaces.msg import SetParametersResult
    from rclpy.parameter import Parameter

    active = node._state_machine.current_state[1] == "active"
    mapper_changes, node_changes = {}, {}
    for index, parameter in enumerate(parameters):
        name, stage = parameter.name, when(parameter.name) if parameter.name in FIELDS else None
        if stage is None:
            continue
        if stage == CONFIGURE:
            return SetParametersResult(successful=False, reason=f"'{name}' is read-only while the node runs")
        if stage == ACTIVATE and active:
            return SetParametersResult(successful=False, reason=(
                f"'{name}' is taken at activate: deactivate the node, set it, activate again"))
        if integer_for_float(FIELDS[name], parameter.value):
            # Stored as a float, as a YAML 1 for 1.0 is: rclpy stores the very list it hands to this
            # callback, so the replaced element is what the parameter becomes (no type change).
            parameter = Parameter(name, Parameter.Type.DOUBLE, float(parameter.value))
            parameters[index] = parameter
        target = mapper_changes if name in MapperSettings.__dataclass_fields__ else node_changes
        target[name] = parameter.value
    try:
        current = {name: node.get_parameter(name).value for name in FIELDS}
        current.update(node.refused_parameters)
        settings, node_settings = split({**current, **mapper_changes, **node_changes})
    except SettingsError as error:
        return SetParametersResult(successful=False, reason=str(error))
    for name in (*mapper_changes, *node_changes):   # a refused start-up value is replaced by a good one
        node.refused_parameters.pop(name, None)
    if node.mapper is not None and mapper_changes:
        # Applied on the worker (between frames) and waited for as a service is: the answer says
        # what happened there (not started within service_timeout_s: cancelled, nothing changed).
        from lingbot_ros.ros.services import run_on_worker

        mapper = node.mapper

        def apply():
            try:
                mapper.apply_live(settings)
            except Exception as error:   # validated above, so a bug: counted and logged with its traceback
                node.safety.caught("live Mapper parameters", error)
                raise

        applied, why = run_on_worker(node, apply)
        if not applied:
            node.get_logger().error(f"parameters {sorted(mapper_changes)} not applied: {why}")
            return SetParametersResult(successful=False, reason=f"not applied: {why}")
    if node.cfg is not None and node_changes:
        try:
            node.apply_live(node_settings)
        except Exception as error:   # a value its range allowed that the node could not apply: a bug
            node.safety.caught("set parameters", error)
            return SetParametersResult(successful=False, reason=f"not applied: {type(error).__name__}: {error}")
    return SetParametersResult(successful=True)


def defaults_yaml() -> str:
    """config/map.yaml: every parameter with its default and description (the file is this text;
    ``python -m lingbot_ros.ros.params > config/map.yaml`` writes it, a test compares)."""
    import json

    lines = ["# Parameters of lingbot_ros map_node with their defaults, written by",
             "# `python -m lingbot_ros.ros.params` from lingbot_ros/mapping/settings.py and",
             "# lingbot_ros/ros/params.py. Use: --ros-args --params-file config/map.yaml, or the launch",
             "# file's params_file argument. Validated at configure.",
             "/**:", "  ros__parameters:"]
    for name, field in FIELDS.items():
        lines.append("    # " + descriptor(field).description)
        value = field.default
        if value == ():   # a ROS params file cannot hold an empty list (rcl reads it as no value)
            lines.append(f"    # {name}: [front, back]   (empty unless set)")
            continue
        lines.append(f"    {name}: {json.dumps(value) if not isinstance(value, float) else repr(value)}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(defaults_yaml(), end="")
