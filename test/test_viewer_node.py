"""map_node's viewer_port over DDS: the page shows the poses the node published (headless
Chromium), and a taken port is refused with an error and a /diagnostics WARN while mapping goes on."""
import socket
import time

import pytest

from helpers import TIMEOUT, free_port, interrupt_and_check_exit, need_module  # noqa: I001 (before the ROS import it guards)

need_module("rclpy", module_level=True)   # a skip, or under LINGBOT_REQUIRE_DATA=1 a failure

from browser import Browser  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]
# Every frame of the replay queued and processed, none dropped (the replay does not wait for the node).
QUEUE = ("image_qos:=reliable", "image_qos_depth:=100", "queue_size:=100", "max_stamp_gap_s:=0.0")
# The replay's reliable writer keeps a history of --depth images (10 by default; the bag records
# none), which still overwrites what the node has not acknowledged: on Jazzy CI the node received
# 17 of the 20 images played. A depth of every image makes delivery certain (as in
# test_tools_replay_rig.py).
DEPTH = "64"


def replay_and_settle(ros, bag):
    replay = ros.replay(bag, "--duration", "2", "--depth", DEPTH)
    assert replay.wait(4 * TIMEOUT) == 0, ros.output(replay)
    return ros.wait(lambda: ros.settled() if time.sleep(1.0) is None and ros.settled() else None,
                    "processed + dropped = received", timeout=120)


def test_node_serves_the_live_view_and_maps_on_when_its_port_is_taken(ros, tiny):
    fixture, bag = tiny
    port = free_port()
    node = ros.start_node(fixture, f"viewer_port:={port}", "viewer_point_budget:=500", "process_all_frames:=true",
                          *QUEUE)
    ros.wait(lambda: ros.statuses, "the node's first status", timeout=120)
    browser = Browser(f"http://127.0.0.1:{port}")
    try:
        status = replay_and_settle(ros, bag)
        assert status.frames_processed == status.frames_received == 20, status
        browser.wait_for_text(f"poses: {status.frames_processed} · units: model units")
    finally:
        browser.close()
    interrupt_and_check_exit(ros, node)

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        node = ros.start_node(fixture, f"viewer_port:={port}", "process_all_frames:=true", *QUEUE)
        ros.wait(lambda: any("live view off" in s.message and f"127.0.0.1:{port}: in use" in s.message
                             for d in ros.diagnostics[-3:] for s in d.status),
                 "the refusal in /diagnostics", timeout=120)
        before = ros.statuses[-1].frames_processed
        status = replay_and_settle(ros, bag)
        assert status.frames_processed - before == 20, status
        assert f"live view off: cannot serve the live view on 127.0.0.1:{port}: in use" in ros.output(node)
        interrupt_and_check_exit(ros, node)
