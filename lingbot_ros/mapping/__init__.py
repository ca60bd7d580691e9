"""The mapping application, without ROS: one camera stream in, placed poses, depth and a map out.

Every front end (the node's worker thread, the offline tool) drives one ``Mapper`` (mapper.py)
through the same verbs. The folders, by concept (docs/layout.md has a line per module):

    mapper.py  streams.py  status.py   the verbs and the frame path; one stream's state and the
                                       one place a stream starts; counts and the snapshot
    outputs.py  placing.py             a session result as a checked output in ``map``; where a
                                       placed output goes (map, database, outcome) and its undo
    map_reads.py                       the map read without changing it (points, view, save)
    settings.py  settings_rules.py     the settings and the rules between them
    factory.py  records.py  warmup_size.py  stamps.py  keyframes.py  long_run.py
                                       the model bundle, the typed values in and out, the warm-up,
                                       the stamp, keyframe and long-run policies
    windows/     the windowed policy: the window rule, the live policy, the offline run,
                 window-to-window similarity
    placement/   everything that puts a pose into REP 105 ``map``: the conversion, robot frames
                 (mount, odometry), the metric scale, numpy pose geometry
    store/       the map and trajectory in memory: voxels, points, the live view's samples
    database/    the map database (SQLite): schema, writer thread, recorder, readback, resume
    files/       files out: PLY/TUM, the preview picture, COLMAP, all-or-none staged writes
    rig/         a camera rig (several cameras, one model, one map): grouping the frames, the
                 RigMapper batching the cameras' model steps, the one map

Import the module that holds a name (``from lingbot_ros.mapping.mapper import Mapper``); this
package re-exports nothing, so importing one part does not load the others.
"""
