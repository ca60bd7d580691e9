"""Per-frame outputs of the streaming session (docs/interfaces.md)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..model.geometry import scale_intrinsic
from .preprocess import resize_plan


@dataclass
class FrameResult:
    """One frame's outputs; tensors on the model's device, float32."""

    index: int                    # frame number since reset (rolled-back frames give their number back)
    is_keyframe: bool             # stored in the caches (all phase-1 frames are)
    time_index: int               # 3D-RoPE temporal index (spec 8.2)
    pose_enc: torch.Tensor        # [9] (tx, ty, tz, qx, qy, qz, qw, fov_h, fov_w)
    pose_enc_list: torch.Tensor   # [I, 9] activated pose after each camera iteration
    extrinsic: torch.Tensor       # [3, 4] camera-to-world, OpenCV axes
    intrinsic: torch.Tensor       # [3, 3] for the model input size
    depth: torch.Tensor           # [H, W]
    depth_conf: torch.Tensor      # [H, W], >= 1
    world_points: torch.Tensor    # [H, W, 3]
    image: torch.Tensor           # [3, H, W] model input in [0, 1]
    image_size: tuple[int, int]   # (W, H) of the model input

    def host_extrinsic(self) -> tuple[np.ndarray, np.ndarray]:
        """(extrinsic [3, 4], checks [3]) on the host in one device -> host copy: the checks are
        max |intrinsic|, max |depth| and max |world point|, reduced where the tensors are (NaN
        or inf where any value is not finite)."""
        extremes = torch.stack([t.detach().abs().amax() for t in (self.intrinsic, self.depth, self.world_points)])
        host = torch.cat([self.extrinsic.detach().reshape(-1), extremes.to(self.extrinsic.dtype)]).cpu().numpy()
        return host[:12].reshape(3, 4), host[12:]

    def intrinsic_for(self, orig_w: int, orig_h: int, patch_size: int = 14) -> torch.Tensor:
        """K for the original image that the Preprocessor turned into this frame (``intrinsic_for_image``)."""
        return intrinsic_for_image(self.intrinsic, self.image_size, orig_w, orig_h, patch_size)


def intrinsic_for_image(intrinsic: torch.Tensor, image_size: tuple[int, int], orig_w: int, orig_h: int,
                        patch_size: int = 14) -> torch.Tensor:
    """K for the original image that the Preprocessor turned into a model input of ``image_size``
    (W, H) with K ``intrinsic`` (undoes resize + crop). A function too, so that a thread holding
    only K and the size (the map database's writer, on the host) uses the same rule.

    Frames not made by the Preprocessor's rule (other height) get a plain per-axis rescale.
    """
    plan = resize_plan(orig_w, orig_h, image_size[0], patch_size)
    if plan.height != image_size[1]:
        return scale_intrinsic(intrinsic, image_size, (orig_w, orig_h))
    K = intrinsic.clone()
    K[1, 2] += plan.crop_top          # back to the uncropped resized image
    return scale_intrinsic(K, (plan.width, plan.resized_height), (orig_w, orig_h))
