"""tf2 in the venv (scripts/install_tf2.sh from ../shared/vendor/geometry2): tf2_ros imports and
looks a transform up, and the full tf2_msgs has the TFMessage type of the distro (the same type
hash as the TFMessage-only build it replaces, so /tf interoperates with distro nodes)."""
import json
import sys
from pathlib import Path

import pytest

from helpers import need_module, need_path

need_module("rclpy", module_level=True)
pytestmark = pytest.mark.ros   # needs rclpy: runs on Jazzy too (.ci/run runs only `ros` there)

# RIHS01 of tf2_msgs/msg/TFMessage: the TFMessage-only build's, Jazzy's and Kilted's.
TFMESSAGE_HASH = "RIHS01_e369d0f05a23ae52508854b66f6aa0437f3449d652e8cbf22d5abe85d020f087"


def test_the_installed_tfmessage_has_the_distro_type_hash():
    description = Path(sys.prefix, "share", "tf2_msgs", "msg", "TFMessage.json")
    if not description.exists():
        pytest.skip(f"no generated tf2_msgs in {sys.prefix} (a distro's own is used)")
    hashes = json.loads(description.read_text())["type_hashes"]
    assert {h["type_name"]: h["hash_string"] for h in hashes}["tf2_msgs/msg/TFMessage"] == TFMESSAGE_HASH


def test_tf2_ros_is_installed_where_the_vendored_geometry2_is(shared_dir):
    need_path(shared_dir / "vendor" / "geometry2" / "tf2", "vendored geometry2 (scripts/install_tf2.sh builds tf2_ros from it)")
    import tf2_ros
    from geometry_msgs.msg import TransformStamped
    from rclpy.time import Time

    buffer = tf2_ros.Buffer()
    transform = TransformStamped()
    transform.header.frame_id, transform.child_frame_id = "base_link", "cam"
    transform.transform.translation.x, transform.transform.rotation.w = 0.25, 1.0
    buffer.set_transform_static(transform, "test")
    found = buffer.lookup_transform("base_link", "cam", Time())
    assert (found.transform.translation.x, found.transform.rotation.w) == (0.25, 1.0)
    import tf2_msgs.srv  # noqa: F401 (the full package: tf2_ros needs its services)
