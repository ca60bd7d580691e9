"""lingbot-ros-replay for a camera rig (issue 29): several bags, or several image topics of one
bag, played together, each camera's images where a node with ``cameras:=[...]`` reads them
(``<node>/<name>/image[/compressed]``). The player runs as a subprocess over DDS; a probe node
receives every camera topic; the stamps are checked against the bags themselves."""
import numpy as np
import pytest

from helpers import need_module  # noqa: I001 (before the ROS imports it guards)

rclpy = need_module("rclpy", module_level=True)
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy  # noqa: E402
from rosbags.rosbag2 import Reader, StoragePlugin, Writer  # noqa: E402
from rosbags.typesys import Stores, get_typestore  # noqa: E402
from sensor_msgs.msg import CameraInfo, CompressedImage, Image  # noqa: E402
from std_msgs.msg import String  # noqa: E402

from helpers import Probe, need_path, stamp_ns, wait_until  # noqa: E402
from lingbot_ros.tools.replay_inputs import choose_tracks, merged_messages, parse_cameras  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]
TOPIC = "/camera/image_raw/compressed"   # the shared bags' one topic
KEEP_ALL = QoSProfile(history=HistoryPolicy.KEEP_ALL, reliability=ReliabilityPolicy.RELIABLE)
TIMEOUT = 60.0
START_S, DURATION_S = 1.0, 3.0
# A reliable writer's keep_last history still overwrites what a reader has not acknowledged yet:
# at 5x on a loaded machine the probe fell 6 images behind a depth of 10 (Jazzy CI). A depth of
# every image played makes delivery certain; the default depth is tested in test_tools_replay_qos.
DEPTH = 64
TYPESTORE = get_typestore(Stores.ROS2_KILTED)


@pytest.fixture
def probe(tmp_path):
    env = Probe(tmp_path)
    yield env
    env.close()


@pytest.fixture
def bags(shared_dir):
    return (need_path(shared_dir / "data" / "courthouse_bag"), need_path(shared_dir / "data" / "loop_bag"))


def recorded_stamps(bag, topic: str, start_s: float = START_S, duration_s: float = DURATION_S) -> list[int]:
    """Header stamps of ``topic``'s messages received in [start + start_s, + duration_s), from the bag."""
    with Reader(bag) as reader:
        t0 = reader.start_time + round(start_s * 1e9)
        return [stamp_ns(TYPESTORE.deserialize_cdr(raw, c.msgtype).header)
                for c, t, raw in reader.messages() if c.topic == topic and t0 <= t < t0 + round(duration_s * 1e9)]


def listen(probe, topics: dict[str, type]) -> dict[str, list[int]]:
    """Header stamps received per topic, in arrival order."""
    received = {topic: [] for topic in topics}
    for topic, kind in topics.items():
        probe.node.create_subscription(kind, topic, lambda msg, t=topic: received[t].append(stamp_ns(msg.header)),
                                       KEEP_ALL)
    return received


def play_and_collect(probe, received, expected, *args):
    player = probe.play(*args, "--start", str(START_S), "--duration", str(DURATION_S), "--rate", "5",
                        "--depth", str(DEPTH), "--wait-for-subscribers", "20")
    assert player.wait(TIMEOUT) == 0, probe.output(player)
    wait_until(lambda: all(len(received[t]) >= len(expected[t]) for t in expected), "every camera's images",
               TIMEOUT, details=lambda: f"{ {t: len(s) for t, s in received.items()} }; {probe.output(player)}")
    return probe.output(player)


def test_two_bags_play_together_each_to_its_camera_topic(probe, bags):
    courthouse, loop = bags
    expected = {"/map_node/front/image/compressed": recorded_stamps(courthouse, TOPIC),
                "/map_node/rear/image/compressed": recorded_stamps(loop, TOPIC)}
    assert all(len(stamps) == 30 for stamps in expected.values())
    received = listen(probe, dict.fromkeys(expected, CompressedImage))
    output = play_and_collect(probe, received, expected, str(courthouse), str(loop),
                              "--camera", "front", "--camera", "rear")
    assert received == expected   # every image, each camera's in stamp order
    assert f"/map_node/front/image/compressed: reliable, volatile, keep_last {DEPTH} " \
           f"(--qos reliable: none recorded) (bag 1: {TOPIC})" in output, output
    assert "published 60 messages" in output


def test_one_bag_given_twice_plays_as_two_cameras_of_the_named_node(probe, bags):
    courthouse, _ = bags
    stamps = recorded_stamps(courthouse, TOPIC)
    expected = {"/rig/left/image/compressed": stamps, "/rig/right/image/compressed": stamps}
    received = listen(probe, dict.fromkeys(expected, CompressedImage))
    play_and_collect(probe, received, expected, str(courthouse), str(courthouse),
                     "--camera", "left", "--camera", "right", "--node", "/rig")
    assert received == expected


def write_rig_bag(path, camera_info: bool = False):
    """One bag of a two-camera rig: a raw front camera at 10 Hz, a compressed rear one 30 ms
    behind it, and a topic of another kind; with ``camera_info``, each camera's camera_info beside
    its image topic (width 2 front, 4 rear) and one of a camera no --camera names."""
    Header, Time = TYPESTORE.types["std_msgs/msg/Header"], TYPESTORE.types["builtin_interfaces/msg/Time"]
    RawImage, Jpeg = TYPESTORE.types["sensor_msgs/msg/Image"], TYPESTORE.types["sensor_msgs/msg/CompressedImage"]
    text = TYPESTORE.types["std_msgs/msg/String"]
    t0 = 1_700_000_000 * 10**9

    def header(t):
        return Header(stamp=Time(sec=t // 10**9, nanosec=t % 10**9), frame_id="cam")

    with Writer(path, version=9, storage_plugin=StoragePlugin.MCAP) as writer:
        front = writer.add_connection("/front/image_raw", RawImage.__msgtype__, typestore=TYPESTORE)
        rear = writer.add_connection("/rear/image_raw/compressed", Jpeg.__msgtype__, typestore=TYPESTORE)
        chatter = writer.add_connection("/chatter", text.__msgtype__, typestore=TYPESTORE)
        Info = TYPESTORE.types["sensor_msgs/msg/CameraInfo"]
        infos = {topic: (writer.add_connection(topic, Info.__msgtype__, typestore=TYPESTORE), width)
                 for topic, width in (("/front/camera_info", 2), ("/rear/camera_info", 4), ("/side/camera_info", 6))
                 } if camera_info else {}
        for k in range(10):
            t = t0 + k * 10**8
            image = RawImage(header=header(t), height=2, width=2, encoding="rgb8", is_bigendian=0, step=6,
                             data=np.zeros(12, np.uint8))
            writer.write(front, t, TYPESTORE.serialize_cdr(image, RawImage.__msgtype__))
            jpeg = Jpeg(header=header(t + 3 * 10**7), format="jpeg", data=np.zeros(4, np.uint8))
            writer.write(rear, t + 3 * 10**7, TYPESTORE.serialize_cdr(jpeg, Jpeg.__msgtype__))
            for connection, width in infos.values():
                info = Info(header=header(t), height=2, width=width, distortion_model="", d=np.zeros(0),
                            k=np.zeros(9), r=np.zeros(9), p=np.zeros(12), binning_x=0, binning_y=0,
                            roi=TYPESTORE.types["sensor_msgs/msg/RegionOfInterest"](
                                x_offset=0, y_offset=0, height=0, width=0, do_rectify=False))
                writer.write(connection, t, TYPESTORE.serialize_cdr(info, Info.__msgtype__))
        writer.write(chatter, t0, TYPESTORE.serialize_cdr(text(data="hi"), text.__msgtype__))


def test_one_bags_image_topics_go_to_the_cameras_that_name_them(probe, tmp_path):
    bag = tmp_path / "rig_bag"
    write_rig_bag(bag)
    expected = {"/map_node/front/image": recorded_stamps(bag, "/front/image_raw", 0, 10),
                "/map_node/rear/image/compressed": recorded_stamps(bag, "/rear/image_raw/compressed", 0, 10)}
    received = listen(probe, {"/map_node/front/image": Image, "/map_node/rear/image/compressed": CompressedImage})
    chatter = []
    probe.node.create_subscription(String, "/chatter", lambda msg: chatter.append(msg.data), KEEP_ALL)
    player = probe.play(str(bag), "--camera", "front:=/front/image_raw", "--camera",
                        "rear:=/rear/image_raw/compressed", "--rate", "5", "--wait-for-subscribers", "20")
    assert player.wait(TIMEOUT) == 0, probe.output(player)
    wait_until(lambda: all(len(received[t]) == 10 for t in expected) and chatter, "every message", TIMEOUT,
               details=lambda: probe.output(player))
    assert received == expected and chatter == ["hi"]   # the other topic as recorded


def test_a_cameras_recorded_camera_info_goes_to_that_camera(probe, tmp_path):
    """The camera_info beside a camera's recorded image topic plays as that camera's
    (<node>/<name>/camera_info, where a rig node with use_camera_info reads it); another
    camera's stays under its recorded name."""
    bag = tmp_path / "rig_bag"
    write_rig_bag(bag, camera_info=True)
    widths = {topic: [] for topic in ("/map_node/front/camera_info", "/map_node/rear/camera_info",
                                      "/side/camera_info", "/front/camera_info")}
    for topic, seen in widths.items():
        probe.node.create_subscription(CameraInfo, topic, lambda msg, seen=seen: seen.append(msg.width), KEEP_ALL)
    player = probe.play(str(bag), "--camera", "front:=/front/image_raw", "--camera",
                        "rear:=/rear/image_raw/compressed", "--rate", "5", "--wait-for-subscribers", "20")
    assert player.wait(TIMEOUT) == 0, probe.output(player)
    wait_until(lambda: all(len(widths[t]) == 10 for t in list(widths)[:3]), "every camera_info", TIMEOUT,
               details=lambda: f"{ {t: len(w) for t, w in widths.items()} }; {probe.output(player)}")
    assert widths == {"/map_node/front/camera_info": [2] * 10, "/map_node/rear/camera_info": [4] * 10,
                      "/side/camera_info": [6] * 10, "/front/camera_info": []}


def test_several_bags_merge_in_receive_time_order(bags):
    """The merge itself, over the two shared bags read whole: every message once, each bag's in
    its own order, all in receive-time order, a tie in the order the bags were given."""
    readers = [Reader(bag) for bag in bags]
    for reader in readers:
        reader.open()
    try:
        tracks = choose_tracks([r.connections for r in readers], parse_cameras(["a", "b"]), {}, None, "/map_node")
        merged = [(timestamp, track.bag) for track, timestamp, _ in merged_messages(readers, tracks, 0, None)]
        per_bag = [[t for _, t, _ in reader.messages()] for reader in readers]
    finally:
        for reader in readers:
            reader.close()
    assert [len(times) for times in per_bag] == [286, 237]
    assert merged == sorted(merged)   # receive time, then the bag given first
    assert [[t for t, bag in merged if bag == i] for i in range(2)] == per_bag
