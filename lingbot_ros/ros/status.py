"""~/status (MapStatus) and /diagnostics from one Mapper snapshot plus the node's input counters."""
from __future__ import annotations

import threading

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue

from lingbot_ros.mapping.records import STATE_NAMES, MapperSnapshot
from lingbot_ros.ros.diagnostics import Counters, memory_bytes
from lingbot_ros.ros.health import Report

FRAME_COUNTS = ("received", "processed", "dropped", "rejected", "failed", "camera_info_rejected",
                "odometry_received", "odometry_rejected", "tf_rejected", "callback_errors")


def frames_accounted(status) -> int:
    """The frames a MapStatus accounts for: processed, buffered for phase 1 (``init_frames``, not
    placed yet), dropped, rejected, failed and held past a stamp jump (``frames_held``: the next
    frame decides them). Equal to ``frames_received`` once nothing is in flight; a front end that
    paces itself by the node counts these, or it waits on a held frame only its next one decides."""
    return (status.frames_processed + status.init_frames + status.frames_dropped + status.frames_rejected
            + status.frames_failed + status.frames_held)


SAME_NAMED = ("init_frames", "init_frames_needed", "keyframes", "cache_pages", "cache_bytes", "model_ms",
              "map_points", "trajectory_poses", "window", "window_scale", "window_overlap_error", "scale_known",
              "scale")


def fill_status(msg, snapshot: MapperSnapshot, inputs: dict, counters: Counters, stamp, frame_id: str,
                lifecycle: str):
    """``msg``: an empty MapStatus. ``inputs``: Counters.snapshot(); ``lifecycle``: '' when
    active, else what the node is doing instead ('inactive: the stream is paused', ...)."""
    msg.header.stamp = stamp
    msg.header.frame_id = frame_id
    msg.state = snapshot.state
    msg.state_text = f"{lifecycle}; {snapshot.state_text}" if lifecycle else snapshot.state_text
    if snapshot.map_database_error:
        msg.state_text += f"; map database: {snapshot.map_database_error}"
    for name in SAME_NAMED:   # MapStatus fields that are the snapshot's of the same name
        setattr(msg, name, getattr(snapshot, name))
    msg.frames_received = inputs["received"]
    msg.frames_processed = snapshot.processed
    msg.frames_dropped = inputs["dropped"]
    msg.frames_rejected = inputs["rejected"] + snapshot.rejected
    msg.frames_failed = snapshot.failed
    msg.frames_held = snapshot.held_frames
    msg.restarts = snapshot.restarts
    msg.camera_info_rejected = inputs["camera_info_rejected"]
    msg.odometry_received = inputs["odometry_received"]
    msg.odometry_rejected = inputs["odometry_rejected"]
    msg.tf_rejected = inputs["tf_rejected"]
    msg.callback_errors = inputs["callback_errors"]
    msg.latency_ms = float(counters.latency_ms)
    msg.last_error = counters.last_error
    msg.scale_spread = float(min(snapshot.scale_spread, 3.4e38))   # float32's range (inf while unknown)
    msg.scale_text = snapshot.scale_text if not snapshot.scale_known else "known"
    return msg


def totals(snapshot: MapperSnapshot | None, inputs: dict) -> dict:
    """Health's cumulative counts: the node's input counters (Counters.snapshot()) plus the
    Mapper's (none while unconfigured)."""
    mapper = snapshot or MapperSnapshot()
    return {**inputs, "rejected": inputs["rejected"] + mapper.rejected, "processed": mapper.processed,
            "failed": mapper.failed}


def diagnostic_array(stamp, node_name: str, hardware_id: str, report: Report, snapshot: MapperSnapshot | None,
                     counters: Counters, device: str, lifecycle: str, extra: dict) -> DiagnosticArray:
    """Two statuses: ``<node>: LingBot-Map`` (the health level, its reasons worst first, and the
    numbers) and ``<node>: image input frequency`` (diagnostic_updater's FrequencyStatus keys).
    ``snapshot`` is None while no Mapper exists (unconfigured); ``lifecycle`` as in fill_status."""
    window = report.window
    if snapshot is None:
        state_text = lifecycle
    else:
        state_text = STATE_NAMES[snapshot.state] + ": " + snapshot.state_text
        state_text = f"{lifecycle}; {state_text}" if lifecycle else state_text
    rss, cuda = memory_bytes(device)
    pairs = {
        "state": state_text,
        "diagnostics_window_s": f"{window.duration_s:.2f}",
        **{f"frames_{name}_in_window": str(window.counts[name]) for name in FRAME_COUNTS},
        "input_rate_hz": f"{window.rate_hz('received'):.2f}",
        "processed_rate_hz": f"{window.rate_hz('processed'):.2f}",
        "seconds_since_image": "" if report.quiet_s is None else f"{report.quiet_s:.1f}",
        "latency_ms_mean": f"{window.latency_ms_mean:.1f}",
        "latency_ms_last": f"{counters.latency_ms:.1f}",
        **{f"frames_{name}": str(window.totals[name]) for name in FRAME_COUNTS},
        "process_peak_rss_bytes": str(rss),
        "cuda_allocated_bytes": str(cuda),
        # A leak of workers across lifecycle cycles would show here (it must stay 1 or 0).
        "worker_threads": str(sum(t.name == "lingbot_worker" and t.is_alive() for t in threading.enumerate())),
        "map_builder_threads": str(sum(t.name == "lingbot_map_builder" and t.is_alive()
                                       for t in threading.enumerate())),
        "last_error": counters.last_error,
    }
    if snapshot is not None:
        pairs.update({
            "model_ms_last": f"{snapshot.model_ms:.1f}",
            "cache_keyframes": str(snapshot.keyframes),
            "cache_pages": str(snapshot.cache_pages),
            "cache_bytes": str(snapshot.cache_bytes),
            "map_points": str(snapshot.map_points),
            "trajectory_poses": str(snapshot.trajectory_poses),
            "stream_restarts": str(snapshot.restarts),
            "frames_held": str(snapshot.held_frames),
            "window": str(snapshot.window),
            "window_scale": f"{snapshot.window_scale:.6g}",
            "window_overlap_error": f"{snapshot.window_overlap_error:.4g}",
            "metric_scale": f"{snapshot.scale:.6g}" if snapshot.scale_known else "unknown",
            "metric_scale_spread": f"{snapshot.scale_spread:.4g}",
            "metric_scale_status": snapshot.scale_text or "known",
            "map_database": snapshot.map_database,
        })
    pairs.update(extra)
    frequency = report.frequency
    array = DiagnosticArray()
    array.header.stamp = stamp
    array.status = [_status(report.level, f"{node_name}: LingBot-Map", report.message(state_text), hardware_id,
                            pairs),
                    _status(frequency.level, f"{node_name}: image input frequency", frequency.message, hardware_id,
                            frequency.values)]
    return array


def _status(level: int, name: str, message: str, hardware_id: str, pairs: dict) -> DiagnosticStatus:
    return DiagnosticStatus(level=bytes([level]), name=name, message=message, hardware_id=hardware_id,
                            values=[KeyValue(key=k, value=str(v)) for k, v in pairs.items()])
