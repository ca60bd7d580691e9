"""Streaming LingBot-Map reconstruction for ROS 2."""

__version__ = "0.1.0"
