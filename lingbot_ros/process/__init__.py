"""The process around the node and the tools, no ROS import: how a signal ends it (interrupts).

It sits beside io/ at the bottom of the layers because both front ends use it: ros/main.py (the
node's entry point) and every command line in tools/. Below both, neither imports the other.
"""
