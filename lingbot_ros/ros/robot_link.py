"""How the node meets the robot: the camera mount from TF, the robot's odometry, the TF output.

    mount      base_frame -> the image's frame_id, looked up in TF (tf2_ros, or the /tf_static
               listener in a venv) when the first image arrives; else the camera_mount setting.
               A rig: each camera's, from its own first image
    odometry   T_odom_base from ~/odometry_in (nav_msgs/Odometry, remappable) or, with
               odometry_source tf (tf2_ros only), from TF at each image stamp; fed to the
               Mapper's buffer (metric scale) and to the map -> odom transform
    TF         one edge per pose (ros/tf_output.py)
"""
from __future__ import annotations

from nav_msgs.msg import Odometry
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.duration import Duration
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy

from lingbot_ros.mapping.settings import MAX_MOUNT_M
from lingbot_ros.ros.input_checks import MAX_ODOMETRY_M, Refused, check_odometry, checked_matrix, deserialized
from lingbot_ros.ros.messages import TfUnavailable, header_stamp_ns, stamp_msg
from lingbot_ros.ros.tap import Tap
from lingbot_ros.ros.tf_lookup import TfLookup
from lingbot_ros.ros.tf_output import make_tf_output

# Best effort matches every odometry publisher, reliable or not (a reliable reader misses a
# best-effort driver's messages entirely); a lost sample is interpolated over. The history holds
# a drain period's samples at 1 kHz four times over.
ODOMETRY_DRAIN_PERIOD_S = 0.05
ODOMETRY_QOS = QoSProfile(reliability=ReliabilityPolicy.BEST_EFFORT, history=HistoryPolicy.KEEP_LAST, depth=200)
# The buffer keeps a sample every 5 ms at most (200 Hz; interpolation between them is far finer
# than the model's poses): a sample stamped sooner after the last one kept is skipped from its
# raw bytes, before it is deserialised and checked, so 1 kHz odometry costs what 200 Hz does.
ODOMETRY_MIN_SPACING_NS = 5_000_000


class RobotLink:
    """``mapper``: the node's (odometry and TF: a rig's RigFront); ``cameras``: a rig's camera ->
    its Mapper (None: one camera, ``mapper`` takes the mount); ``counters``: the node's Counters
    (odometry and TF refusals are counted there); ``clock``: the ImageClock that odometry stamps
    are checked against."""

    def __init__(self, node, cfg, mapper, counters, clock, cameras: dict | None = None):
        self.node, self.cfg, self.mapper = node, cfg, mapper
        self.counters, self.clock = counters, clock
        self.mounts = cameras if cameras is not None else {"": mapper}   # camera ("": the one) -> its Mapper
        self._unresolved = set(self.mounts)
        self.mount_refusals: dict[str, str] = {}   # camera -> why TF's mount was refused, while it matters
        # Side inputs never wait behind an image callback, nor it behind them.
        group = MutuallyExclusiveCallbackGroup()
        def tf_refused(text: str) -> None:
            counters.refused("tf_rejected", text)

        try:
            self.lookup = TfLookup(node, on_refused=tf_refused)
        except TfUnavailable as error:   # no tf2_msgs: the camera_mount setting is the mount
            self.lookup, self.lookup_failure = None, str(error)
        self.tf, why = make_tf_output(node, cfg, on_refused=tf_refused)
        if self.tf is None and cfg.tf_mode != "none":
            node.get_logger().warning(why)
        needs_odometry = mapper.settings.scale_source == "odometry" or cfg.tf_mode == "map_to_odom"
        self.from_tf = needs_odometry and cfg.odometry_source == "tf"
        if self.from_tf and (self.lookup is None or not self.lookup.dynamic):
            node.get_logger().warning("odometry_source tf needs tf2_ros (a ROS distro): no odometry; use "
                                      "odometry_source topic and remap ~/odometry_in")
        # Read in batches (ros/tap.py): at 1 kHz, a callback per sample took the image path half its
        # frames. Best effort matches every publisher, so no QoS can be incompatible.
        self._kept_ns: int | None = None   # the newest odometry sample that passed the checks
        self._subscription = (Tap(node, Odometry, node.resolve_topic_name("~/odometry_in"), ODOMETRY_QOS,
                                  self._on_odometry_raw, ODOMETRY_DRAIN_PERIOD_S, group, "odometry callback",
                                  raw=True)
                              if needs_odometry and not self.from_tf else None)
        self.odometry_topic = self._subscription.topic if self._subscription is not None else ""
        # map -> odom again at a fixed rate, post-dated by transform_timeout_s (slam_toolbox's
        # transform_publish_period / transform_timeout): Nav2 looks it up at "now", between frames.
        self._timer = (node.create_timer(cfg.transform_publish_period_s,
                                         node.safety.guard("TF republish timer", self._republish),
                                         callback_group=group)
                       if self.tf is not None and cfg.tf_mode == "map_to_odom" and cfg.transform_publish_period_s > 0
                       else None)

    def _republish(self) -> None:
        tf = self.tf   # destroy() may clear it meanwhile
        if tf is not None:
            tf.republish((self.node.get_clock().now() + Duration(seconds=self.cfg.transform_timeout_s)).to_msg())

    def _on_odometry_raw(self, serialized: bytes, info=None) -> None:
        stamp_ns = header_stamp_ns(serialized)
        if (stamp_ns is not None and self._kept_ns is not None
                and 0 <= stamp_ns - self._kept_ns < ODOMETRY_MIN_SPACING_NS):
            self.counters.add("odometry_received")
            return
        self._on_odometry(serialized)

    def _on_odometry(self, serialized: bytes) -> None:
        self.counters.add("odometry_received")
        try:
            msg = deserialized(serialized, Odometry, "odometry")
            stamp_ns, pose = check_odometry(msg, self.cfg.odom_frame, self.cfg.base_frame, self.clock,
                                            self.cfg.max_input_ahead_s, self.mapper.odometry_max_age_s)
        except Refused as error:
            text = f"{self.odometry_topic}: {error}"
            self.counters.refused("odometry_rejected", text)
            self.node.get_logger().warning(text, throttle_duration_sec=5.0)
            return
        self._kept_ns = stamp_ns
        self._store(stamp_ns, pose)

    def _store(self, stamp_ns: int, pose) -> None:
        """Into the Mapper's odometry buffer. A sample older than the buffer's newest by more than
        the buffer keeps, yet near the image clock (the boundary checked it), means the stream
        went back (a looped bag, a clock reset): the previous loop's samples go. A stream restart
        alone clears nothing: the frames still queued keep their odometry."""
        self.mapper.add_odometry(stamp_ns, pose, went_back_ok=self.clock.has_image)

    def before_frame(self, frame, camera: str = "") -> None:
        """On the worker, before the Mapper sees ``frame`` (of a rig's ``camera``): the mount (the
        camera's first frame only) and, from TF, the robot's odometry at the frame's stamp."""
        if camera in self._unresolved:
            self._unresolved.discard(camera)
            self._resolve_mount(frame.frame_id, camera)
            if not self._unresolved and not self.from_tf and self.lookup is not None:
                # The mount is looked up once: a listener kept on /tf would decode every transform
                # of the robot's tree (and of others) for nothing, beside the image path.
                self.lookup.destroy()
                self.lookup = None
        if self.from_tf and self.lookup is not None and self.lookup.dynamic:
            pose = self.lookup.lookup_at(self.cfg.odom_frame, self.cfg.base_frame, stamp_msg(frame.stamp_ns),
                                          timeout_s=0.05)
            pose = self._checked(pose, f"TF {self.cfg.odom_frame} -> {self.cfg.base_frame}", MAX_ODOMETRY_M)
            if pose is not None:
                self._store(frame.stamp_ns, pose)

    def _checked(self, pose, what: str, bound_m: float):
        """A looked-up pose through the input boundary: the pose, or None (counted, logged)."""
        if pose is None:
            return None
        try:
            return checked_matrix(pose, what, bound_m)
        except Refused as error:
            self.counters.refused("tf_rejected", str(error))
            self.node.get_logger().warning(str(error), throttle_duration_sec=5.0)
            return None

    def _resolve_mount(self, frame_id: str, camera: str) -> None:
        logger, base = self.node.get_logger(), self.cfg.base_frame
        whose = f"camera {camera}: " if camera else ""
        found = self.lookup.lookup(base, frame_id) if self.lookup is not None and frame_id else None
        pose = self._checked(found, f"{whose}camera mount {base} -> {frame_id}", MAX_MOUNT_M)
        if pose is not None:
            self.mounts[camera].set_camera_mount(pose, f"TF {base} -> {frame_id}")
            logger.info(f"{whose}camera mount from TF: {base} -> {frame_id}")
            return
        if found is not None or (self.lookup is not None and self.lookup.last_refused):
            # TF has one, refused (here or in the lookup): the map is built on the parameter instead
            self.mount_refusals[camera] = (
                f"{whose}the camera mount {base} -> {frame_id} on TF was refused ("
                f"{self.counters.last_refusal.get('tf_rejected', '')}): the camera_mount parameter is used")
            why = "refused"
        else:
            why = (self.lookup.last_failure if self.lookup is not None else self.lookup_failure) or "no frame_id"
        logger.info(f"{whose}camera mount from the camera_mount parameter ({self.mapper.settings.camera_mount}): "
                    f"no TF {base} -> {frame_id or '(image without frame_id)'} ({why})")

    def publish(self, output) -> None:
        if self.tf is None:
            return
        scale = output.conversion.metric if output.conversion is not None else None
        if output.conversion is not None and output.conversion.metric_pending:
            # Before the metric scale is known the map is in model units: a map -> odom from it
            # would move by metres per frame and jump when the scale locks. None goes out until then.
            self.tf.hold(f"waiting for the metric scale ({scale.reason})")
            return
        self.tf.publish(stamp_msg(output.stamp_ns), output.base_pose, output.camera_pose,
                        self.mapper.odometry_at(output.stamp_ns))

    def warnings(self) -> list[str]:
        """Standing problems for /diagnostics (WARN): frames processed but no odometry arrived, or
        map -> odom not going out."""
        out = []
        if (self._subscription is not None and self.mapper.snapshot.processed
                and not self.counters.snapshot()["odometry_received"]):
            out.append(f"{self.odometry_topic}: no odometry received (needed by tf_mode {self.cfg.tf_mode} / "
                       f"scale_source {self.mapper.settings.scale_source}); check the remap and the publisher")
        out.extend(self.mount_refusals.values())
        if self.tf is not None and self.tf.skipping:
            out.append(self.tf.describe())
        return out

    def describe(self) -> dict:
        """Diagnostics entries (the TF conflict, if any, comes first)."""
        out = {"camera_mount": self.mapper.snapshot.camera_mount}
        if self.tf is not None:
            out["tf"] = self.tf.describe()
        return out

    @property
    def conflict(self):
        return self.tf.conflict if self.tf is not None else None

    def destroy(self) -> None:
        if self._timer is not None:
            self.node.destroy_timer(self._timer)
            self._timer = None
        if self._subscription is not None:
            self._subscription.destroy()
        if self.tf is not None:
            self.tf.destroy()
        if self.lookup is not None:
            self.lookup.destroy()
        self._subscription = self.tf = self.lookup = None
