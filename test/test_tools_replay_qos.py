"""lingbot-ros-replay offers each topic the QoS it was recorded with (issue 13).

The choice is checked against rmw's own compatibility rule (every subscription that matched a
recorded publisher matches the replaying one), against hand-computed profiles, and end to end: a
bag written with rosbags whose /tf_static was recorded transient-local reaches a transient-local
subscriber created after the player published it.
"""
import signal

import pytest

from helpers import need_module  # noqa: I001 (before the ROS imports it guards)

rclpy = need_module("rclpy", module_level=True)
pytestmark = pytest.mark.ros   # needs rclpy: runs on Jazzy too (.ci/run runs only `ros` there)
from hypothesis import given, settings, strategies as st  # noqa: E402
from rclpy.duration import Duration  # noqa: E402
from rclpy.qos import (DurabilityPolicy, HistoryPolicy, LivelinessPolicy, QoSCompatibility,  # noqa: E402
                       QoSProfile, ReliabilityPolicy, qos_check_compatible, qos_profile_sensor_data)
from rosbags.interfaces import (Qos, QosDurability, QosHistory, QosLiveliness, QosReliability,  # noqa: E402
                                QosTime)
from rosbags.rosbag2 import StoragePlugin, Writer  # noqa: E402
from rosbags.typesys import Stores, get_typestore  # noqa: E402
from std_msgs.msg import String  # noqa: E402

from helpers import Probe, wait_until  # noqa: E402
from lingbot_ros.tools.replay import message_class  # noqa: E402
from lingbot_ros.tools.replay_qos import parse_overrides, preset, recorded_profile  # noqa: E402

INFINITE = QosTime(9223372036, 854775807)        # RMW_DURATION_INFINITE as rosbag2 records it
OLD_INFINITE = QosTime(2147483647, 4294967295)   # the sentinel of older bags
UNSET = QosTime(0, 0)
RELIABLE_10 = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
TIMEOUT = 30.0


def offer(reliability=QosReliability.RELIABLE, durability=QosDurability.VOLATILE,
          history=QosHistory.KEEP_LAST, depth=10, deadline=INFINITE, lifespan=INFINITE,
          liveliness=QosLiveliness.AUTOMATIC, lease=INFINITE) -> Qos:
    return Qos(history, depth, reliability, durability, deadline, lifespan, liveliness, lease, False)


LATCHED_1 = offer(durability=QosDurability.TRANSIENT_LOCAL, depth=1)


# ---- the choice, by hand -------------------------------------------------------------------

def test_no_recorded_offer_leaves_the_choice_to_the_fallback():
    assert recorded_profile([], RELIABLE_10) is None


def test_one_latched_offer_is_replayed_as_recorded_with_infinite_durations_unset():
    qos = recorded_profile([LATCHED_1], RELIABLE_10)
    assert (qos.reliability, qos.durability) == (ReliabilityPolicy.RELIABLE, DurabilityPolicy.TRANSIENT_LOCAL)
    assert (qos.history, qos.depth) == (HistoryPolicy.KEEP_LAST, 1)
    assert qos.deadline.nanoseconds == qos.lifespan.nanoseconds == 0
    assert qos.liveliness_lease_duration.nanoseconds == 0
    assert qos.liveliness == LivelinessPolicy.AUTOMATIC


def test_mixed_offers_take_the_strongest_delivery_policies():
    best_effort = offer(QosReliability.BEST_EFFORT, depth=5, deadline=QosTime(0, 200_000_000),
                        lifespan=QosTime(1, 0))
    latched = offer(durability=QosDurability.TRANSIENT_LOCAL, depth=2, deadline=QosTime(0, 100_000_000),
                    lifespan=QosTime(3, 0), liveliness=QosLiveliness.MANUAL_BY_NODE, lease=QosTime(2, 0))
    qos = recorded_profile([best_effort, latched], RELIABLE_10)
    assert (qos.reliability, qos.durability) == (ReliabilityPolicy.RELIABLE, DurabilityPolicy.TRANSIENT_LOCAL)
    # Only the latched publisher held messages for late subscribers: its depth, not the other's.
    assert (qos.history, qos.depth) == (HistoryPolicy.KEEP_LAST, 2)
    assert qos.deadline == Duration(nanoseconds=100_000_000)
    assert qos.lifespan == Duration(seconds=3)
    assert qos.liveliness == LivelinessPolicy.MANUAL_BY_TOPIC
    assert qos.liveliness_lease_duration == Duration(seconds=2)


def test_several_latched_publishers_are_all_kept_for_late_subscribers():
    qos = recorded_profile([LATCHED_1, LATCHED_1, offer(durability=QosDurability.TRANSIENT_LOCAL, depth=3)],
                           RELIABLE_10)
    assert (qos.history, qos.depth) == (HistoryPolicy.KEEP_LAST, 5)


def test_volatile_offers_keep_the_deepest_history_and_keep_all_wins():
    assert recorded_profile([offer(depth=3), offer(depth=7)], RELIABLE_10).depth == 7
    assert recorded_profile([offer(depth=3), offer(history=QosHistory.KEEP_ALL, depth=0)],
                            RELIABLE_10).history == HistoryPolicy.KEEP_ALL


def test_a_lifespan_is_kept_only_when_every_publisher_had_one():
    assert recorded_profile([offer(lifespan=QosTime(1, 0)), offer()], RELIABLE_10).lifespan.nanoseconds == 0


def test_unknown_and_system_default_policies_fall_back_to_the_preset():
    unknown = offer(QosReliability.UNKNOWN, QosDurability.SYSTEM_DEFAULT, QosHistory.UNKNOWN, 0,
                    OLD_INFINITE, UNSET, QosLiveliness.UNKNOWN, OLD_INFINITE)
    qos = recorded_profile([unknown], qos_profile_sensor_data)
    assert (qos.reliability, qos.durability) == (ReliabilityPolicy.BEST_EFFORT, DurabilityPolicy.VOLATILE)
    assert (qos.history, qos.depth) == (HistoryPolicy.KEEP_LAST, qos_profile_sensor_data.depth)
    assert qos.deadline.nanoseconds == qos.liveliness_lease_duration.nanoseconds == 0


def test_presets_are_fresh_objects_and_overrides_parse():
    sensor = preset("sensor_data", 10)
    sensor.depth = 99
    assert qos_profile_sensor_data.depth == 5
    latched = preset("latched", 3)
    assert (latched.durability, latched.depth) == (DurabilityPolicy.TRANSIENT_LOCAL, 3)
    assert parse_overrides(["reliable", "/tf_static:=latched"]) == ("reliable", {"/tf_static": "latched"})
    for bad in ("fast", ":=latched", "/tf:=fast"):
        with pytest.raises(ValueError, match="TOPIC:=PRESET"):
            parse_overrides([bad])


# ---- the choice against rmw's compatibility rule ---------------------------------------------

_DURATIONS = [UNSET, INFINITE, QosTime(0, 50_000_000), QosTime(0, 100_000_000), QosTime(1, 0)]
_offers = st.builds(
    offer, st.sampled_from([QosReliability.RELIABLE, QosReliability.BEST_EFFORT]),
    st.sampled_from([QosDurability.VOLATILE, QosDurability.TRANSIENT_LOCAL]),
    st.sampled_from([QosHistory.KEEP_LAST, QosHistory.KEEP_ALL]), st.integers(1, 5),
    st.sampled_from(_DURATIONS), st.sampled_from(_DURATIONS),
    st.sampled_from([QosLiveliness.AUTOMATIC, QosLiveliness.MANUAL_BY_TOPIC]), st.sampled_from(_DURATIONS))
_requests = st.builds(
    lambda reliability, durability, deadline, liveliness, lease: QoSProfile(
        depth=1, reliability=reliability, durability=durability, deadline=deadline,
        liveliness=liveliness, liveliness_lease_duration=lease),
    st.sampled_from([ReliabilityPolicy.RELIABLE, ReliabilityPolicy.BEST_EFFORT]),
    st.sampled_from([DurabilityPolicy.VOLATILE, DurabilityPolicy.TRANSIENT_LOCAL]),
    st.sampled_from([Duration(), Duration(seconds=0.05), Duration(seconds=0.2), Duration(seconds=2)]),
    st.sampled_from([LivelinessPolicy.AUTOMATIC, LivelinessPolicy.MANUAL_BY_TOPIC]),
    st.sampled_from([Duration(), Duration(seconds=0.05), Duration(seconds=0.2), Duration(seconds=2)]))


def _as_recorded(o: Qos) -> QoSProfile:
    """The recorded publisher's own profile, durations as recorded (rmw reads the sentinels)."""
    def duration(t: QosTime) -> Duration:
        return Duration(seconds=t.sec, nanoseconds=t.nsec)

    return QoSProfile(depth=max(o.depth, 1), reliability=ReliabilityPolicy[o.reliability.name],
                      durability=DurabilityPolicy[o.durability.name], deadline=duration(o.deadline),
                      liveliness=LivelinessPolicy[o.liveliness.name],
                      liveliness_lease_duration=duration(o.liveliness_lease_duration))


def _matches(publisher: QoSProfile, subscription: QoSProfile) -> bool:
    return qos_check_compatible(publisher, subscription)[0] != QoSCompatibility.ERROR


@settings(max_examples=300, deadline=None)
@given(st.lists(_offers, min_size=1, max_size=4), st.lists(_requests, min_size=1, max_size=6))
def test_every_subscription_a_recorded_publisher_served_is_served_on_replay(offers, requests):
    chosen = recorded_profile(offers, RELIABLE_10)
    for request in requests:
        if any(_matches(_as_recorded(o), request) for o in offers):
            assert _matches(chosen, request), qos_check_compatible(chosen, request)[1]


# ---- end to end: a written bag, the player as a subprocess, a late latched subscriber ----------

def _tf_message(typestore):
    Header, Time = typestore.types["std_msgs/msg/Header"], typestore.types["builtin_interfaces/msg/Time"]
    Transform = typestore.types["geometry_msgs/msg/TransformStamped"]
    Vector3, Quaternion = typestore.types["geometry_msgs/msg/Vector3"], typestore.types["geometry_msgs/msg/Quaternion"]
    Tf = typestore.types["geometry_msgs/msg/Transform"]
    stamped = Transform(Header(Time(1, 0), "base_link"), "camera",
                        Tf(Vector3(0.1, 0.0, 0.5), Quaternion(0.0, 0.0, 0.0, 1.0)))
    return typestore.types["tf2_msgs/msg/TFMessage"](transforms=[stamped])


def write_bag(path, tf_type: str):
    """/tf_static (one message, latched keep-last 1), /latched_pair (two latched publishers, one
    message each), /chatter (recorded without QoS)."""
    typestore = get_typestore(Stores.ROS2_KILTED)
    string = typestore.types["std_msgs/msg/String"]
    with Writer(path, version=9, storage_plugin=StoragePlugin.MCAP) as writer:
        tf = writer.add_connection("/tf_static", tf_type, typestore=typestore,
                                   offered_qos_profiles=[LATCHED_1])
        pair = writer.add_connection("/latched_pair", "std_msgs/msg/String", typestore=typestore,
                                     offered_qos_profiles=[LATCHED_1, LATCHED_1])
        chatter = writer.add_connection("/chatter", "std_msgs/msg/String", typestore=typestore)
        tf_msg = string(data="base_link->camera") if tf_type == "std_msgs/msg/String" else _tf_message(typestore)
        t0 = 1_700_000_000 * 10**9
        writer.write(tf, t0, typestore.serialize_cdr(tf_msg, tf_type))
        writer.write(pair, t0 + 10**8, typestore.serialize_cdr(string(data="first"), "std_msgs/msg/String"))
        writer.write(pair, t0 + 2 * 10**8, typestore.serialize_cdr(string(data="second"), "std_msgs/msg/String"))
        writer.write(chatter, t0 + 3 * 10**8, typestore.serialize_cdr(string(data="hi"), "std_msgs/msg/String"))


@pytest.fixture
def probe(tmp_path):
    env = Probe(tmp_path)
    yield env
    env.close()




LATE_LATCHED = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE,
                          durability=DurabilityPolicy.TRANSIENT_LOCAL)


@pytest.mark.parametrize("tf_type", ["std_msgs/msg/String", "tf2_msgs/msg/TFMessage"], ids=["String", "TFMessage"])
def test_a_latched_topic_reaches_a_subscriber_that_comes_after_it_was_published(probe, tmp_path, tf_type):
    if tf_type.startswith("tf2_msgs"):
        need_module("tf2_msgs.msg")
    bag = tmp_path / "latched_bag"
    write_bag(bag, tf_type)
    player = probe.play(str(bag), "--rate", "10", "--hold", "inf")
    wait_until(lambda: "published 4 messages" in probe.output(player), "the player's last message",
               TIMEOUT, details=lambda: probe.output(player))
    assert player.poll() is None, probe.output(player)

    tf, pair = [], []
    probe.node.create_subscription(message_class(tf_type), "/tf_static", tf.append, LATE_LATCHED)
    probe.node.create_subscription(String, "/latched_pair", lambda m: pair.append(m.data), LATE_LATCHED)
    wait_until(lambda: tf and len(pair) == 2, "the latched messages", TIMEOUT,
               details=lambda: f"tf {tf}, pair {pair}; {probe.output(player)}")
    if tf_type == "std_msgs/msg/String":
        assert [m.data for m in tf] == ["base_link->camera"]
    else:
        assert [(t.header.frame_id, t.child_frame_id) for t in tf[0].transforms] == [("base_link", "camera")]
    assert pair == ["first", "second"]   # two recorded publishers: both messages stay latched

    offered = {topic: probe.node.get_publishers_info_by_topic(topic)[0].qos_profile
               for topic in ("/tf_static", "/latched_pair", "/chatter")}
    # History depth is not discovered (it is local): the /latched_pair messages above show it.
    assert offered["/tf_static"].durability == DurabilityPolicy.TRANSIENT_LOCAL
    assert offered["/chatter"].durability == DurabilityPolicy.VOLATILE   # --qos reliable
    assert offered["/chatter"].reliability == ReliabilityPolicy.RELIABLE

    player.send_signal(signal.SIGINT)
    assert player.wait(TIMEOUT) == 0, probe.output(player)


def test_qos_override_replaces_the_recorded_profile(probe, tmp_path):
    bag = tmp_path / "latched_bag"
    write_bag(bag, "std_msgs/msg/String")
    player = probe.play(str(bag), "--rate", "10", "--hold", "inf", "--qos-override", "/tf_static:=sensor_data")
    def offered(topic):
        infos = probe.node.get_publishers_info_by_topic(topic)
        return infos[0].qos_profile if infos else None

    tf_static, pair = wait_until(lambda: offered("/tf_static") and offered("/latched_pair") and
                                 (offered("/tf_static"), offered("/latched_pair")),
                                 "the player's publishers", TIMEOUT, details=lambda: probe.output(player))
    assert (tf_static.reliability, tf_static.durability) == (ReliabilityPolicy.BEST_EFFORT, DurabilityPolicy.VOLATILE)
    assert pair.durability == DurabilityPolicy.TRANSIENT_LOCAL   # not overridden: as recorded
    assert "/tf_static: best_effort, volatile, keep_last 5 (--qos-override sensor_data)" in probe.output(player)
    player.send_signal(signal.SIGINT)
    assert player.wait(TIMEOUT) == 0, probe.output(player)
