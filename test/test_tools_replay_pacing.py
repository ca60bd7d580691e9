"""lingbot-ros-replay --wait-for-node: the player never leads the node by more than --max-lead
images, so a bag replayed faster than the node runs loses nothing (issue 11, defect 5).

A fake node in the test process plays map_node: it reads the images reliable keep-all,
"processes" one per 50 ms and publishes lingbot_ros/MapStatus on /fake_node/status (latched) as
it goes. No timing is asserted: the lead is counted in images.
"""
import re

import pytest

from helpers import need_module  # noqa: I001 (before the ROS imports it guards)

rclpy = need_module("rclpy", module_level=True)
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy  # noqa: E402
from rosbags.rosbag2 import Reader  # noqa: E402
from rosbags.typesys import Stores, get_typestore  # noqa: E402
from sensor_msgs.msg import CompressedImage  # noqa: E402

from helpers import SETUP, Probe, missing, need_path, stamp_ns, wait_until  # noqa: E402

try:
    from lingbot_ros.msg import MapStatus
except ImportError:
    missing("the generated lingbot_ros interfaces (lingbot_ros.msg)", SETUP, module_level=True)

pytestmark = [pytest.mark.ros, pytest.mark.slow]
TOPIC = "/camera/image_raw/compressed"
PROCESS_PERIOD_S = 0.05
MAX_LEAD = 3
START_S, DURATION_S = 1.0, 4.0
# The bag is 10 Hz; at 10x an image goes out every 10 ms while the fake node needs 50 ms each.
RATE = "10"
BASE = 7   # frames the fake node processed before this replay: the player must not count them
TIMEOUT = 60.0


class FakeNode:
    """Accounts for one queued image per period (every 4th as rejected, the rest processed) and
    stops doing anything after ``stop_after`` images, like a node that died. Image ``hold`` is
    held (``frames_held``) until the next one arrives, as the node holds a frame whose stamp
    jumped ahead until the next frame decides it."""

    def __init__(self, node, stop_after: int | None = None, hold: int | None = None):
        self.node = node
        self.stop_after = stop_after
        self.hold, self.held = hold, 0
        self.stamps: list[int] = []   # header stamps of the received images, in arrival order
        self.leads: list[int] = []    # at each received image: its index - images accounted for
        self.processed = self.rejected = 0
        latched = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE,
                             durability=DurabilityPolicy.TRANSIENT_LOCAL)
        self.status = node.create_publisher(MapStatus, "/fake_node/status", latched)
        keep_all = QoSProfile(history=HistoryPolicy.KEEP_ALL, reliability=ReliabilityPolicy.RELIABLE)
        node.create_subscription(CompressedImage, TOPIC, self._on_image, keep_all)
        self.timer = node.create_timer(PROCESS_PERIOD_S, self._process_one)
        self._publish()

    @property
    def accounted(self) -> int:
        return self.processed + self.rejected

    def _on_image(self, msg) -> None:
        self.stamps.append(stamp_ns(msg.header))
        self.leads.append(len(self.stamps) - self.accounted)

    def _process_one(self) -> None:
        if self.accounted == len(self.stamps):
            return
        if self.stop_after is not None and self.accounted == self.stop_after:
            self.timer.cancel()
            return
        if self.accounted == self.hold and len(self.stamps) == self.hold + 1:
            if not self.held:
                self.held = 1
                self._publish()
            return
        self.held = 0
        if (self.accounted + 1) % 4 == 0:
            self.rejected += 1
        else:
            self.processed += 1
        self._publish()

    def _publish(self) -> None:
        status = MapStatus()
        status.frames_received = BASE + len(self.stamps)   # runs ahead: not what the player may use
        status.frames_processed = BASE + self.processed
        status.frames_rejected = self.rejected
        status.frames_held = self.held
        self.status.publish(status)


@pytest.fixture
def bag(shared_dir):
    return need_path(shared_dir / "data" / "courthouse_bag")


def bag_stamps(bag) -> list[int]:
    """Header stamps of the images the player sends for --start/--duration (receive time in
    [start, start + duration)), read from the bag itself."""
    typestore = get_typestore(Stores.ROS2_KILTED)
    with Reader(bag) as reader:
        t0 = reader.start_time + round(START_S * 1e9)
        stamps = []
        for connection, timestamp, raw in reader.messages():
            if connection.topic == TOPIC and t0 <= timestamp < t0 + round(DURATION_S * 1e9):
                stamp = typestore.deserialize_cdr(raw, connection.msgtype).header.stamp
                stamps.append(stamp.sec * 10**9 + stamp.nanosec)
    return stamps


def replay(probe, bag, *extra):
    return probe.play(str(bag), "--start", str(START_S), "--duration", str(DURATION_S), "--rate", RATE,
                      *extra)


def test_the_player_never_leads_the_node_by_more_than_max_lead(bag, tmp_path):
    expected = bag_stamps(bag)
    assert len(expected) == 40

    # Without pacing the player runs 5x faster than the node: the lead grows far past MAX_LEAD.
    unpaced = Probe(tmp_path / "unpaced", node_name="fake_node")
    try:
        fake = FakeNode(unpaced.node)
        player = replay(unpaced, bag, "--wait-for-subscribers", "20")
        assert player.wait(TIMEOUT) == 0, unpaced.output(player)
        assert max(fake.leads) > 3 * MAX_LEAD, fake.leads
    finally:
        unpaced.close()

    paced = Probe(tmp_path / "paced", node_name="fake_node")
    try:
        fake = FakeNode(paced.node)
        player = replay(paced, bag, "--wait-for-node", "/fake_node", "--max-lead", str(MAX_LEAD),
                        "--node-timeout", "20")
        assert player.wait(TIMEOUT) == 0, paced.output(player)
        assert fake.stamps == expected   # every image, in order
        assert max(fake.leads) <= MAX_LEAD, fake.leads
        # The player exits only once the node has accounted for the last image.
        assert fake.accounted == len(expected)
        output = paced.output(player)
        assert f"{TOPIC}: reliable, volatile, keep_all" in output
        waited = re.search(r"waited (\d+\.\d+) s in total for /fake_node", output)
        assert waited and float(waited.group(1)) > 0, output
    finally:
        paced.close()


def test_a_node_that_stops_answering_makes_the_player_give_up(bag, tmp_path):
    probe = Probe(tmp_path, node_name="fake_node")
    try:
        fake = FakeNode(probe.node, stop_after=5)
        # The timeout also bounds the start (first status, image subscription): not too short.
        player = replay(probe, bag, "--wait-for-node", "/fake_node", "--max-lead", str(MAX_LEAD),
                        "--node-timeout", "5")
        assert player.wait(TIMEOUT) == 1, probe.output(player)
        assert "/fake_node accounted for 5 of 8 images and sent no status for 5 s" in probe.output(player)
        wait_until(lambda: fake.stamps, "the first image", TIMEOUT)
        assert len(fake.stamps) <= 5 + MAX_LEAD and max(fake.leads) <= MAX_LEAD
    finally:
        probe.close()


def test_a_frame_the_node_holds_counts_as_accounted_so_the_player_sends_the_one_that_decides_it(bag, tmp_path):
    expected = bag_stamps(bag)
    probe = Probe(tmp_path, node_name="fake_node")
    try:
        fake = FakeNode(probe.node, hold=10)
        # At lead 1 a player that waited for the held image to be processed would send nothing
        # more, the node nothing either: no status for --node-timeout, and the player fails.
        player = replay(probe, bag, "--wait-for-node", "/fake_node", "--max-lead", "1", "--node-timeout", "5")
        assert player.wait(TIMEOUT) == 0, probe.output(player)
        assert fake.stamps == expected and fake.accounted == len(expected) and fake.held == 0
    finally:
        probe.close()
