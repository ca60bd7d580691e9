"""Files out: PLY/TUM, the preview picture, COLMAP, all-or-none staged writes."""
