"""A camera rig: several cameras, one model, one batched model step per group of frames, one map.

Each camera is an ordinary ``Mapper`` (its own stamps, windows, policies, restarts, mount and map
store) over its own stream of one ``MultiStreamSession``; the rig batches their model steps.

    rig_mapper.py    RigMapper: the rig's verbs over its cameras' Mappers
    baton.py         one worker thread per camera, one running at a time; their parked model
                     steps run as one batched step
    session_view.py  one stream of the MultiStreamSession as a Mapper's session
    scale.py         each camera's scale against the primary's, from their base trajectories
    rig_map.py       the one map: every camera's map at the primary's scale, voxelised once; saved
    cameras.py       the camera names and the primary, checked
    records.py       the typed values in and out (RigFrame, RigOutcome, RigScale, SavedRigMap)
"""
