"""A camera rig (issue 29): several cameras' frames grouped into batched steps, one map.

    grouping.py   which frames of the rig's cameras run together (settings, rule, counters)

Import the module that holds a name; this package re-exports nothing.
"""
