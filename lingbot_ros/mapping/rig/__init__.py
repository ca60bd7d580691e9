"""A camera rig (issue 29): several cameras, one model, one batched model step per group of
frames, one map.

Each camera is an ordinary ``Mapper`` (its own stamps, windows, policies, restarts, mount and map
store) over its own stream of one ``MultiStreamSession``; the rig batches their model steps.

    grouping.py      which frames of the rig's cameras run together (settings, rule, counters)
    rig_mapper.py    RigMapper: the rig's verbs over its cameras' Mappers
    baton.py         one worker thread per camera, one running at a time; their parked model
                     steps run as one batched step
    session_view.py  one stream of the MultiStreamSession as a Mapper's session
    scale.py         each camera's scale against the primary's, from their base trajectories
    rig_map.py       the one map: every camera's map at the primary's scale, voxelised once; saved
    cameras.py       a rig's cameras (grouping.py's rule), its primary camera, what it refuses
    records.py       the typed values out (RigOutcome, RigScale, SavedRigMap)

Import the module that holds a name; this package re-exports nothing.
"""
