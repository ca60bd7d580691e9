"""Everything that puts a pose into REP 105 ``map``: conversion, robot frames, metric scale, geometry."""
