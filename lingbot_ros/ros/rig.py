"""map_node with a camera rig (parameter ``cameras``): the RigMapper seen as the node's mapper,
the cameras' own topics and the per-camera status. ROS wiring only; the rig is mapping/rig/.

    RigFront       the Mapper verbs the node, its services and parameters call, over one RigMapper:
                   the primary camera's snapshot, path and odometry (~/pose, ~/odom, ~/path, TF,
                   ~/status), the rig's one map (~/map, ~/save_map), reset and flush of every
                   camera, rollback of the primary
    CameraOutputs  ~/<name>/pose (the camera's optical frame in map_frame, in that camera's map
                   units) and ~/<name>/depth/image with its camera_info
    camera_lines   one line per camera for /diagnostics: its counters, state, mount and scale
                   against the primary; camera_summary: the short one ~/status's state_text ends with
"""
from __future__ import annotations

import dataclasses

from geometry_msgs.msg import PoseStamped
from sensor_msgs.msg import CameraInfo, Image

from lingbot_ros.mapping.records import STATE_NAMES, StepOutcome
from lingbot_ros.mapping.rig.records import RigScale, SavedRigMap
from lingbot_ros.mapping.rig.rig_mapper import RigMapper
from lingbot_ros.ros import messages, topics
from lingbot_ros.ros.outputs import publish_image
from lingbot_ros.ros.qos import OUTPUT_QOS


# MapperSnapshot's frame counts, summed over a rig's cameras in the node's snapshot.
SUMMED = ("init_frames", "held_frames", "processed", "rejected", "failed", "restarts", "rolled_back", "cleared")


@dataclasses.dataclass(frozen=True)
class SavedRig:
    """A rig's save as ~/save_map answers it: the one map, the primary camera's trajectory (every
    camera's file is named in the message)."""

    saved: SavedRigMap
    primary: str

    @property
    def message(self) -> str:
        return self.saved.message

    @property
    def ply_path(self) -> str:
        return self.saved.ply_path

    @property
    def tum_path(self) -> str:
        return self.saved.tum_paths[self.primary]

    @property
    def num_points(self) -> int:
        return self.saved.num_points

    @property
    def num_poses(self) -> int:
        return self.saved.num_poses[self.primary]


def labelled(outcomes: dict[str, StepOutcome]) -> StepOutcome:
    """Every camera's notices in one outcome, each text naming its camera."""
    notices = [dataclasses.replace(notice, text=f"camera {camera}: {notice.text}")
               for camera, outcome in outcomes.items() for notice in outcome.notices]
    return StepOutcome(notices=notices)


class RigFront:
    """The node's mapper when ``cameras`` is set. Every call is on the node's worker thread (the
    only one touching the rig), except the snapshot and odometry reads, which are thread-safe as
    the single Mapper's are."""

    def __init__(self, rig: RigMapper):
        self.rig = rig
        self.primary = rig.camera(rig.primary)   # its Mapper: snapshot, path, odometry (one buffer)
        self.scales: dict[str, RigScale] = {}    # refreshed by refresh_scales (worker), read by status

    @property
    def settings(self):
        return self.rig.settings

    @property
    def snapshot(self):
        """The primary camera's, with the frame counts of every camera (~/status's frames
        received, from every camera's topic, are then accounted for)."""
        snapshots = [self.rig.camera(camera).snapshot for camera in self.rig.cameras]
        return dataclasses.replace(self.primary.snapshot, **{
            name: sum(getattr(snapshot, name) for snapshot in snapshots) for name in SUMMED})

    def process(self, group):
        return self.rig.process(group)

    def warm_up(self, size) -> float:
        return self.rig.warm_up(size)

    def reset(self, reason: str) -> StepOutcome:
        return labelled(self.rig.reset(reason).outcomes)

    def rollback_last_frame(self) -> str:
        """The primary camera's newest frame undone (the one ~/pose and TF come from)."""
        return f"camera {self.rig.primary}: {self.rig.rollback_last_frame(self.rig.primary)}"

    def flush(self) -> str:
        return self.rig.flush()

    def new_window(self) -> str:
        raise ValueError("new_window is not available with cameras (a camera rig): each camera's windows "
                         "switch by themselves")

    def apply_live(self, settings) -> None:
        # Between rig verbs no camera thread runs: each camera's Mapper takes them as one would.
        for camera in self.rig.cameras:
            self.rig.camera(camera).apply_live(settings)
        self.rig.settings = settings

    def map_points(self):
        return self.rig.map_points()

    def path_poses(self, count=None):
        return self.primary.path_poses(count)

    def save(self, directory) -> SavedRig:
        return SavedRig(self.rig.save(directory), self.rig.primary)

    def refresh_scales(self) -> None:
        self.scales = self.rig.scales

    def add_odometry(self, stamp_ns: int, pose, went_back_ok: bool = False) -> bool:
        return self.rig.add_odometry(stamp_ns, pose, went_back_ok)

    @property
    def odometry_max_age_s(self) -> float:
        return self.primary.odometry_max_age_s

    def odometry_at(self, stamp_ns: int):
        return self.primary.odometry_at(stamp_ns)

    def close(self) -> None:
        self.rig.close()


@dataclasses.dataclass
class CameraOutputs:
    """One rig camera's topics (lifecycle publishers)."""

    node: object
    pose: object
    depth: object
    depth_info: object

    @classmethod
    def create(cls, node, camera: str) -> "CameraOutputs":
        lifecycle = node.create_lifecycle_publisher
        return cls(node=node, pose=lifecycle(PoseStamped, topics.camera_topic(camera, "pose"), OUTPUT_QOS),
                   depth=lifecycle(Image, topics.camera_topic(camera, "depth/image"), OUTPUT_QOS),
                   depth_info=lifecycle(CameraInfo, topics.camera_topic(camera, "depth/camera_info"), OUTPUT_QOS))

    def destroy(self) -> None:
        for publisher in (self.pose, self.depth, self.depth_info):
            self.node.destroy_lifecycle_publisher(publisher)

    def image_fields(self) -> tuple[str, ...]:
        fields = set()
        if self.depth.get_subscription_count():
            fields.add("depth")
        if self.depth_info.get_subscription_count():
            fields.add("intrinsic")
        return tuple(sorted(fields))

    def poses(self, output, cfg) -> None:
        if self.pose.get_subscription_count():
            self.pose.publish(messages.pose_stamped(output.camera_pose, messages.stamp_msg(output.stamp_ns),
                                                    cfg.map_frame))

    def images(self, output, cfg) -> None:
        """From host copies (output_thread.to_host), on the output thread."""
        publish_image(self.depth, self.depth_info, output.depth, output, cfg)


def camera_lines(front: RigFront, counters: dict, quiet_s: dict) -> dict[str, str]:
    """``camera <name>`` -> one line: its input counters (``counters[name]``: Counters.snapshot()),
    seconds since its newest image (``quiet_s[name]``, None before any), its Mapper's state, mount
    and scale against the primary."""
    lines = {}
    for camera in front.rig.cameras:
        snapshot, counts, quiet = front.rig.camera(camera).snapshot, counters[camera], quiet_s[camera]
        scale = front.scales.get(camera)
        heard = "no image yet" if quiet is None else f"newest image {quiet:.1f} s ago"
        role = " (primary)" if camera == front.rig.primary else ""
        lines[f"camera {camera}"] = (
            f"{camera}{role}: {counts['received']} received, {snapshot.processed} processed, {counts['dropped']} "
            f"dropped, {counts['rejected'] + snapshot.rejected} rejected, {snapshot.failed} failed, "
            f"{snapshot.restarts} restarts; {heard}; {snapshot.state_text}; mount {snapshot.camera_mount}; scale "
            f"against the primary: {scale.text if scale is not None else 'not computed yet'}")
    return lines


def camera_summary(front: RigFront) -> str:
    """Every camera's state and frames processed, for ~/status (whose numbers are the primary's)."""
    parts = []
    for camera in front.rig.cameras:
        snapshot = front.rig.camera(camera).snapshot
        role = " (primary)" if camera == front.rig.primary else ""
        parts.append(f"{camera}{role} {STATE_NAMES[snapshot.state]}, {snapshot.processed} processed")
    return "cameras: " + "; ".join(parts)
