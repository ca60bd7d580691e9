"""~/status (MapStatus) and /diagnostics from one Mapper snapshot plus the node's input counters."""
from __future__ import annotations

import threading

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue

from lingbot_ros.mapping.records import STATE_NAMES, MapperSnapshot
from lingbot_ros.ros.diagnostics import Counters, memory_bytes


def fill_status(msg, snapshot: MapperSnapshot, inputs: dict, counters: Counters, stamp, frame_id: str,
                lifecycle: str):
    """``msg``: an empty MapStatus. ``inputs``: Counters.snapshot(); ``lifecycle``: '' when
    active, else what the node is doing instead ('inactive: the stream is paused', ...)."""
    msg.header.stamp = stamp
    msg.header.frame_id = frame_id
    msg.state = snapshot.state
    msg.state_text = f"{lifecycle}; {snapshot.state_text}" if lifecycle else snapshot.state_text
    msg.init_frames = snapshot.init_frames
    msg.init_frames_needed = snapshot.init_frames_needed
    msg.frames_received = inputs["received"]
    msg.frames_processed = snapshot.processed
    msg.frames_dropped = inputs["dropped"]
    msg.frames_rejected = inputs["rejected"] + snapshot.rejected
    msg.frames_failed = snapshot.failed
    msg.keyframes = snapshot.keyframes
    msg.resets = snapshot.restarts
    msg.cache_pages = snapshot.cache_pages
    msg.cache_bytes = snapshot.cache_bytes
    msg.latency_ms = float(counters.latency_ms)
    msg.model_ms = float(snapshot.model_ms)
    msg.last_error = counters.last_error
    return msg


def diagnostic_array(stamp, name: str, hardware_id: str, snapshot: MapperSnapshot, counters: Counters,
                     device: str, lifecycle: str, extra: dict) -> DiagnosticArray:
    rates, mean_latency = counters.rates(snapshot.processed)
    inputs = counters.snapshot()
    rss, cuda = memory_bytes(device)
    state_text = STATE_NAMES[snapshot.state] + ": " + snapshot.state_text
    if lifecycle:
        state_text = f"{lifecycle}; {state_text}"
    level, message = DiagnosticStatus.OK, state_text
    if counters.last_error:
        level = DiagnosticStatus.WARN
        message = f"{state_text}; last error: {counters.last_error}"
    pairs = {
        "state": state_text,
        "input_rate_hz": f"{rates['received']:.2f}",
        "processed_rate_hz": f"{rates['processed']:.2f}",
        "dropped_rate_hz": f"{rates['dropped']:.2f}",
        "latency_ms_mean": f"{mean_latency:.1f}",
        "latency_ms_last": f"{counters.latency_ms:.1f}",
        "model_ms_last": f"{snapshot.model_ms:.1f}",
        "cache_keyframes": str(snapshot.keyframes),
        "cache_pages": str(snapshot.cache_pages),
        "cache_bytes": str(snapshot.cache_bytes),
        "map_points": str(snapshot.map_points),
        "trajectory_poses": str(snapshot.trajectory_poses),
        "process_peak_rss_bytes": str(rss),
        "cuda_allocated_bytes": str(cuda),
        "frames_received": str(inputs["received"]),
        "frames_processed": str(snapshot.processed),
        "frames_dropped": str(inputs["dropped"]),
        "frames_rejected": str(inputs["rejected"] + snapshot.rejected),
        "frames_failed": str(snapshot.failed),
        "frames_camera_info_rejected": str(inputs["camera_info_rejected"]),
        "stream_restarts": str(snapshot.restarts),
        "window": str(snapshot.window),
        "window_scale": f"{snapshot.window_scale:.6g}",
        "window_overlap_error": f"{snapshot.window_overlap_error:.4g}",
        # A leak of workers across lifecycle cycles would show here (it must stay 1 or 0).
        "worker_threads": str(sum(t.name == "lingbot_worker" and t.is_alive() for t in threading.enumerate())),
        "last_error": counters.last_error,
        **extra,
    }
    status = DiagnosticStatus(level=level, name=name, message=message, hardware_id=hardware_id,
                              values=[KeyValue(key=k, value=str(v)) for k, v in pairs.items()])
    array = DiagnosticArray()
    array.header.stamp = stamp
    array.status = [status]
    return array
