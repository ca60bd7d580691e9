"""The rules between MapperSettings' fields, and which fields may change while the Mapper runs.

A single field's range and choices are its ``setting`` (settings.py); what spans fields is here,
each rule the one the Mapper's parts would otherwise assert at construction.
"""
from __future__ import annotations

import dataclasses

from .placement.metric_scale import pairs_fit
from .settings import LIVE, MAX_CACHE_FRAMES, MapperSettings, parse_image_size
from .warmup_size import image_size_error
from .windows.ahead import ahead_refusal


def cross_field_errors(settings: MapperSettings) -> list[str]:
    """The rules between fields, each the one the Mapper's parts would otherwise assert at
    construction (so that settings that pass here never fail there)."""
    errors = []
    s = settings
    if s.num_scale_frames > s.scale_frames + s.sliding_window:
        errors.append(f"'num_scale_frames' ({s.num_scale_frames}) must be at most scale_frames + "
                      f"sliding_window ({s.scale_frames} + {s.sliding_window}): the phase-1 batch "
                      "would be evicted while it is appended")
    if s.scale_frames + s.sliding_window > MAX_CACHE_FRAMES:
        errors.append(f"'sliding_window' ({s.sliding_window}) plus scale_frames ({s.scale_frames}) must be at most "
                      f"{MAX_CACHE_FRAMES} (the model's max_frame_num; the cache allocates a page for each): "
                      "lower one of them")
    if s.long_run_policy == "windowed":
        layout = s.window_rule().layout()
        if layout.overlap > MAX_CACHE_FRAMES:
            errors.append(f"'overlap_size' / 'overlap_keyframes': the windowed policy's overlap ({layout.overlap} "
                          f"frames) must be at most {MAX_CACHE_FRAMES} (its frames' images stay on the model's "
                          "device to be run again): lower them")
        if not layout.live_overlap_fits:
            errors.append(f"the windowed policy's overlap ({layout.overlap} frames) must be shorter than "
                          f"a window ({layout.window_frames} frames): lower overlap_size / "
                          "overlap_keyframes or raise window_size")
    if s.window_switch_ahead and ahead_refusal(s):
        errors.append(f"'window_switch_ahead' is true but {ahead_refusal(s)} (or set it false)")
    size = parse_image_size(s.warmup_image_size)
    if size is not None:
        error = image_size_error(*size, s.image_width)
        if error:
            errors.append(f"'warmup_image_size' ({s.warmup_image_size}): {error}")
    if not pairs_fit(s.scale_min_pairs, s.scale_window_pairs):
        errors.append(f"'scale_min_pairs' ({s.scale_min_pairs}) must be >= 2 and at most scale_window_pairs "
                      f"({s.scale_window_pairs})")
    return errors


def fixed_changes(old: MapperSettings, new: MapperSettings) -> list[str]:
    """The fields that differ between ``old`` and ``new`` but are not LIVE (they must not change
    while the Mapper runs), sorted."""
    return sorted(f.name for f in dataclasses.fields(new)
                  if getattr(new, f.name) != getattr(old, f.name) and f.metadata.get("when") != LIVE)
