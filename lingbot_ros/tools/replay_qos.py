"""The QoS lingbot-ros-replay offers on each topic.

A rosbag2 keeps, per topic, the QoS profiles that the topic's publishers offered while it was
recorded (``offered_qos_profiles``, one per publisher; empty in bags written without them). The
player has one publisher per topic, so it offers the profile that every subscriber of any recorded
publisher would have accepted: per policy the strongest value offered (reliable over best effort,
transient-local over volatile, the shortest deadline and liveliness lease, manual over automatic
liveliness). A stronger offer still matches every weaker request, so nothing that matched during
the recording is refused on replay, and a transient-local subscriber of /tf_static gets its
latched messages. Policies a profile leaves unknown or at the system default fall back to the
``--qos`` preset, as do topics recorded without profiles.
"""
from __future__ import annotations

import copy
from collections.abc import Sequence

from rclpy.duration import Duration
from rclpy.qos import (DurabilityPolicy, HistoryPolicy, LivelinessPolicy, QoSProfile,
                       ReliabilityPolicy, qos_profile_sensor_data)
from rosbags.interfaces import (Qos, QosDurability, QosHistory, QosLiveliness, QosReliability,
                                QosTime)

PRESETS = ("reliable", "sensor_data", "latched")

# Durations at or beyond 2**31 - 1 s are rmw's "infinite" sentinels: INT64_MAX ns in current bags,
# {2147483647, 4294967295} in older ones. Zero means "not set". Neither constrains anything.
_INFINITE_SEC = 2**31 - 1

_RELIABILITY = {QosReliability.RELIABLE: ReliabilityPolicy.RELIABLE,
                QosReliability.BEST_EFFORT: ReliabilityPolicy.BEST_EFFORT}
_DURABILITY = {QosDurability.TRANSIENT_LOCAL: DurabilityPolicy.TRANSIENT_LOCAL,
               QosDurability.VOLATILE: DurabilityPolicy.VOLATILE}
# rclpy has no MANUAL_BY_NODE any more; by-topic is stricter, so it serves the same subscribers.
_LIVELINESS = {QosLiveliness.AUTOMATIC: LivelinessPolicy.AUTOMATIC,
               QosLiveliness.MANUAL_BY_NODE: LivelinessPolicy.MANUAL_BY_TOPIC,
               QosLiveliness.MANUAL_BY_TOPIC: LivelinessPolicy.MANUAL_BY_TOPIC}


def preset(name: str, depth: int) -> QoSProfile:
    """A new profile (the caller may change it) of --qos / --qos-override; ``depth`` is --depth
    (sensor_data keeps its 5)."""
    if name == "reliable":
        return QoSProfile(depth=depth, reliability=ReliabilityPolicy.RELIABLE)
    if name == "sensor_data":
        return copy.copy(qos_profile_sensor_data)
    if name == "latched":
        return QoSProfile(depth=depth, reliability=ReliabilityPolicy.RELIABLE,
                          durability=DurabilityPolicy.TRANSIENT_LOCAL)
    raise ValueError(f"unknown QoS preset '{name}': choose one of {', '.join(PRESETS)}")


def parse_overrides(items: Sequence[str]) -> tuple[str | None, dict[str, str]]:
    """--qos-override values, each PRESET or TOPIC:=PRESET -> (preset for all topics, per topic)."""
    every, per_topic = None, {}
    for item in items:
        topic, sep, name = item.rpartition(":=")
        if name not in PRESETS or (sep and not topic):
            raise ValueError(f"--qos-override expects PRESET or TOPIC:=PRESET with PRESET one of "
                             f"{', '.join(PRESETS)}, got '{item}'")
        if sep:
            per_topic[topic] = name
        else:
            every = name
    return every, per_topic


def recorded_profile(offers: Sequence[Qos], fallback: QoSProfile) -> QoSProfile | None:
    """The one profile that serves every subscriber the recorded ``offers`` served (None if none)."""
    if not offers:
        return None
    reliabilities = {_RELIABILITY[o.reliability] for o in offers if o.reliability in _RELIABILITY}
    durabilities = {_DURABILITY[o.durability] for o in offers if o.durability in _DURABILITY}
    reliability = (ReliabilityPolicy.RELIABLE if ReliabilityPolicy.RELIABLE in reliabilities
                   else reliabilities.pop() if reliabilities else fallback.reliability)
    durability = (DurabilityPolicy.TRANSIENT_LOCAL if DurabilityPolicy.TRANSIENT_LOCAL in durabilities
                  else durabilities.pop() if durabilities else fallback.durability)
    history, depth = _history(offers, durability == DurabilityPolicy.TRANSIENT_LOCAL, fallback)
    profile = QoSProfile(history=history, depth=depth, reliability=reliability, durability=durability)
    deadlines = [d for d in (_duration(o.deadline) for o in offers) if d]
    if deadlines:
        profile.deadline = min(deadlines)
    lifespans = [_duration(o.lifespan) for o in offers]
    if all(lifespans):   # one publisher that kept its samples for ever decides: keep them
        profile.lifespan = max(lifespans)
    kinds = {_LIVELINESS[o.liveliness] for o in offers if o.liveliness in _LIVELINESS}
    if kinds:
        profile.liveliness = (LivelinessPolicy.MANUAL_BY_TOPIC
                              if LivelinessPolicy.MANUAL_BY_TOPIC in kinds else LivelinessPolicy.AUTOMATIC)
    leases = [d for d in (_duration(o.liveliness_lease_duration) for o in offers) if d]
    if leases:
        profile.liveliness_lease_duration = min(leases)
    return profile


def describe(profile: QoSProfile) -> str:
    """'reliable, transient_local, keep_last 1' plus the durations that are set."""
    history = ("keep_all" if profile.history == HistoryPolicy.KEEP_ALL
               else f"{profile.history.name.lower()} {profile.depth}")
    parts = [profile.reliability.name.lower(), profile.durability.name.lower(), history]
    for name in ("deadline", "lifespan", "liveliness_lease_duration"):
        value = getattr(profile, name)
        if value.nanoseconds:
            parts.append(f"{name} {value.nanoseconds / 1e9:g} s")
    if profile.liveliness == LivelinessPolicy.MANUAL_BY_TOPIC:
        parts.append("liveliness manual_by_topic")
    return ", ".join(parts)


def _history(offers: Sequence[Qos], latched: bool, fallback: QoSProfile) -> tuple[HistoryPolicy, int]:
    if any(o.history == QosHistory.KEEP_ALL for o in offers):
        return HistoryPolicy.KEEP_ALL, fallback.depth
    kept = [o for o in offers if o.history == QosHistory.KEEP_LAST and o.depth > 0
            and (not latched or o.durability == QosDurability.TRANSIENT_LOCAL)]
    if not kept:
        return fallback.history, fallback.depth
    # Each latched publisher held its own last `depth` messages for late subscribers (several
    # static transform publishers on /tf_static): the one replaying publisher holds them all.
    depth = sum(o.depth for o in kept) if latched else max(o.depth for o in kept)
    return HistoryPolicy.KEEP_LAST, depth


def _duration(time: QosTime) -> Duration | None:
    """The recorded duration, or None when it is unset (zero) or infinite."""
    if time.sec >= _INFINITE_SEC or (time.sec == 0 and time.nsec == 0):
        return None
    return Duration(seconds=time.sec, nanoseconds=time.nsec)
