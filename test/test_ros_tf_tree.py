"""StaticTree (the venv's /tf_static chaining) and the TF message conversions, against
hand-computed transforms. No DDS: test_ros_tf.py runs the same trees through real topics."""
import numpy as np
import pytest

from helpers import need_module  # noqa: I001 (before the ROS imports it guards)

need_module("rclpy", module_level=True)
pytestmark = pytest.mark.ros   # needs rclpy: runs on Jazzy too (.ci/run runs only `ros` there)
from lingbot_ros.mapping.placement.geometry import rigid_inverse as inverse  # noqa: E402
from lingbot_ros.ros.messages import transform_stamped  # noqa: E402
from lingbot_ros.ros.tf_lookup import StaticTree  # noqa: E402

from helpers import BASE_OPTICAL, BASE_TO_LINK, LINK_TO_OPTICAL, OPTICAL, OPTICAL_BASE, RZ90, rigid, transform_matrix  # noqa: E402


def robot_tree() -> StaticTree:
    tree = StaticTree()
    tree.set("base_link", "camera_link", transform_matrix(BASE_TO_LINK))
    tree.set("camera_link", "camera_optical_frame", transform_matrix(LINK_TO_OPTICAL))
    return tree


def test_message_quaternions_give_the_hand_written_rotations():
    np.testing.assert_allclose(transform_matrix(BASE_TO_LINK), rigid(RZ90, (0.1, 0.0, 0.2)), atol=1e-12)
    np.testing.assert_allclose(transform_matrix(LINK_TO_OPTICAL), rigid(OPTICAL, (0.02, -0.03, 0.0)), atol=1e-12)


def test_transform_stamped_round_trips_and_names_the_edge():
    msg = transform_stamped(np.array(BASE_OPTICAL, dtype=float), None, "base_link", "camera_optical_frame")
    assert (msg.header.frame_id, msg.child_frame_id) == ("base_link", "camera_optical_frame")
    np.testing.assert_allclose(transform_matrix(msg.transform), BASE_OPTICAL, atol=1e-12)


def test_inverse_is_the_hand_computed_inverse():
    np.testing.assert_allclose(inverse(np.array(BASE_OPTICAL, dtype=float)), OPTICAL_BASE, atol=1e-12)


def test_a_chain_below_the_base_composes_in_both_directions():
    tree = robot_tree()
    np.testing.assert_allclose(tree.lookup("base_link", "camera_optical_frame"), BASE_OPTICAL, atol=1e-12)
    np.testing.assert_allclose(tree.lookup("camera_optical_frame", "base_link"), OPTICAL_BASE, atol=1e-12)
    np.testing.assert_allclose(tree.lookup("camera_link", "camera_optical_frame"),
                               rigid(OPTICAL, (0.02, -0.03, 0.0)), atol=1e-12)


def test_frames_hanging_off_a_common_root_meet_there():
    # base_footprint -> base_link (0, 0, 0.1); base_footprint -> mast (0.2, 0, 0.5) -> cam (0, 0, 0.1, yaw 90).
    tree = StaticTree()
    tree.set("base_footprint", "base_link", rigid(np.eye(3), (0.0, 0.0, 0.1)))
    tree.set("base_footprint", "mast", rigid(np.eye(3), (0.2, 0.0, 0.5)))
    tree.set("mast", "cam", rigid(RZ90, (0.0, 0.0, 0.1)))
    # By hand: base_link sits 0.1 above the root, cam 0.6 above it and 0.2 ahead: (0.2, 0, 0.5).
    np.testing.assert_allclose(tree.lookup("base_link", "cam"), rigid(RZ90, (0.2, 0.0, 0.5)), atol=1e-12)
    np.testing.assert_allclose(tree.lookup("cam", "base_link"),
                               rigid(np.array(RZ90).T, (0.0, 0.2, -0.5)), atol=1e-12)


def test_the_newest_transform_of_a_child_wins():
    tree = robot_tree()
    tree.set("base_link", "camera_link", rigid(np.eye(3), (1.0, 2.0, 3.0)))   # a recalibrated mount
    np.testing.assert_allclose(tree.lookup("base_link", "camera_link"), rigid(np.eye(3), (1.0, 2.0, 3.0)))
    # The chain below it goes through the new mount: (1, 2, 3) + (0.02, -0.03, 0).
    np.testing.assert_allclose(tree.lookup("base_link", "camera_optical_frame"), rigid(OPTICAL, (1.02, 1.97, 3.0)),
                               atol=1e-12)


def test_unconnected_or_unknown_frames_give_none_and_say_why():
    tree = robot_tree()
    tree.set("world", "landmark", np.eye(4))
    assert tree.lookup("base_link", "landmark") is None
    assert "separate static trees" in tree.explain("base_link", "landmark")
    assert tree.lookup("base_link", "camera_color_optical_frame") is None
    why = tree.explain("base_link", "camera_color_optical_frame")
    assert "'camera_color_optical_frame' not on /tf_static" in why
    assert "base_link, camera_link, camera_optical_frame, landmark, world" in why
    assert "transforms on /tf are not read" in why


def test_equal_frames_are_the_identity_and_a_loop_ends_the_walk():
    tree = StaticTree()
    np.testing.assert_array_equal(tree.lookup("nowhere", "nowhere"), np.eye(4))
    tree.set("a", "b", rigid(np.eye(3), (1.0, 0.0, 0.0)))
    tree.set("b", "a", rigid(np.eye(3), (1.0, 0.0, 0.0)))   # bad data: a cycle
    tree.set("b", "c", rigid(np.eye(3), (0.0, 1.0, 0.0)))
    np.testing.assert_allclose(tree.lookup("b", "c"), rigid(np.eye(3), (0.0, 1.0, 0.0)))
    assert tree.lookup("c", "elsewhere") is None
