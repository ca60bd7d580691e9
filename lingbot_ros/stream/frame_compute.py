"""`FrameCompute`: the device work of one model call, without state of its own.

A `StreamingSession`'s calls (phase 1's batch, its phase-2 frames, eager or captured as CUDA
graphs by frame_graph.py) and `MultiStreamSession`'s batched steps of several streams run this
same code; the callers own the caches and pass them in. A call is two parts, so that the caller
can do its caches' host bookkeeping (begin_step, FlashInfer's plan) while the device runs the
first: `embed` (the patch embedding, reads no cache) and `forward` (the aggregator through the
given global attention, the camera head on the given camera cache, the depth head, the geometry).
Neither syncs with the host or changes host state, so a CUDA graph can capture both.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Union

import torch

from ..model.aggregator import AggregatorRun, GlobalAttendFn
from ..model.camera_cache import CameraCacheBatch, CameraKVCache
from ..model.geometry import depth_to_world_points, pose_to_extrinsic, pose_to_intrinsic
from ..model.layers import EAGER_KERNELS, BlockKernels, block_kernels, fused_halves
from ..model.lingbot_map import LingBotMap
from .settings import SettingsError, StreamSettings

# The outputs of `FrameCompute.forward` for a call of F frames: (activated poses [I, F, 9], depth
# [F, H, W, 1], confidence [F, H, W], extrinsic [F, 3, 4], intrinsic [F, 3, 3], world points
# [F, H, W, 3]). A tuple of tensors: the form a captured graph's outputs take.
StepOutputs = tuple[torch.Tensor, ...]

# Frames the depth head runs at once in a call of several (phase 1's batch, a batched step of
# several streams): `FrameCompute._depth`.
DEPTH_HEAD_FRAMES = 1


@dataclasses.dataclass
class SlicedCall:
    """A multi-frame call between its slices (`FrameCompute.begin_sliced`)."""

    run: AggregatorRun
    num_frames: int
    image_hw: tuple[int, int]
    global_attend: GlobalAttendFn
    camera: CameraKVCache
    poses: torch.Tensor | None = None       # the camera head's, once its slice ran
    depth_parts: list = dataclasses.field(default_factory=list)   # the depth head's, a slice each


def frame_outputs(outputs: StepOutputs, i: int) -> StepOutputs:
    """Frame i's part of a call's outputs (views, no copy), in the layout of a one-frame call."""
    poses, *per_frame = outputs
    return (poses[:, i:i + 1], *(t[i:i + 1] for t in per_frame))


def _joined(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """The depth head's chunks as one call's (depth, confidence)."""
    if len(parts) == 1:
        return parts[0]
    return torch.cat([depth for depth, _ in parts]), torch.cat([conf for _, conf in parts])


class FrameCompute:
    def __init__(self, model: LingBotMap, settings: StreamSettings):
        """Raises SettingsError when the model's stored matmul weights do not fit the settings'
        compute dtype."""
        self.model = model
        self.camera_num_iterations = settings.camera_num_iterations
        self.dtype = settings.compute_dtype(model.device)
        if model.matmul_dtype not in (torch.float32, self.dtype):
            raise SettingsError(
                f"the model's matmul weights are stored in {model.matmul_dtype} "
                f"(store_matmul_weights) but this session computes in {self.dtype}; "
                "use that dtype or a model kept in float32")
        # The block kernels of single-frame steps, chosen once: compiled (fused) for CUDA only;
        # on the CPU the eager blocks are the reference path.
        self.frame_kernels: BlockKernels = (
            fused_halves() if settings.fused_blocks and model.device.type == "cuda" else EAGER_KERNELS)

    def embed(self, images: torch.Tensor, frame_steps: bool = False) -> torch.Tensor:
        """images [F, 3, H, W] -> patch tokens [F, N, C]."""
        with self._autocast(), self._kernels(images.shape[0], frame_steps):
            return self.model.aggregator.embed(images)

    def forward(self, patches: torch.Tensor, image_hw: tuple[int, int], time_index: torch.Tensor,
                first_frame: bool, scale_slot: int, global_attend: GlobalAttendFn,
                camera: Union[CameraKVCache, CameraCacheBatch], frame_steps: bool = False) -> StepOutputs:
        """The rest of the call, after `embed` and the caches' begin_step: patches [F, N, C] of
        images of size image_hw (H, W), time_index float64 [F] -> `StepOutputs`.

        frame_steps: the call is a batch of several streams' single-frame steps (one frame of
        each), which runs the single-frame block kernels (compiled once per stream count)."""
        with self._autocast(), self._kernels(patches.shape[0], frame_steps):
            outputs = self.model.aggregator.forward_patches(
                patches, image_hw, first_frame=first_frame, scale_slot=scale_slot, time_index=time_index,
                global_attend=global_attend)
        return self._heads(outputs, image_hw, camera)

    def begin_sliced(self, patches: torch.Tensor, image_hw: tuple[int, int], time_index: torch.Tensor,
                     first_frame: bool, scale_slot: int, global_attend: GlobalAttendFn,
                     camera: CameraKVCache) -> SlicedCall:
        """`forward` cut into slices that `advance` runs one at a time (the caller's caches stay in
        this call's step meanwhile): the same outputs, the device work spread over several calls."""
        with self._autocast(), self._kernels(patches.shape[0], False):
            run = self.model.aggregator.begin(patches, image_hw, first_frame=first_frame, scale_slot=scale_slot,
                                              time_index=time_index)
        return SlicedCall(run, patches.shape[0], image_hw, global_attend, camera)

    def advance(self, call: SlicedCall, layers: int) -> StepOutputs | None:
        """The next ``layers`` frame/global layer pairs of ``call``; once all have run, the camera
        head, then the depth head's chunks (DEPTH_HEAD_FRAMES frames), each a slice of its own;
        the last returns the call's `StepOutputs` (those of `forward`: the same chunks)."""
        if call.run.next_layer < len(self.model.aggregator.frame_blocks):
            with self._autocast(), self._kernels(call.num_frames, False):
                self.model.aggregator.run_layers(call.run, call.global_attend, layers)
            return None
        H, W = call.image_hw
        if call.poses is None:
            call.poses = self._camera(call.run.outputs, call.camera)
            return None
        first = len(call.depth_parts) * DEPTH_HEAD_FRAMES
        call.depth_parts.append(self._depth_chunk(call.run.outputs, first, H, W))
        if first + DEPTH_HEAD_FRAMES < call.num_frames:
            return None
        return self._geometry(call.poses, *_joined(call.depth_parts), W, H)

    def _heads(self, outputs: list[torch.Tensor], image_hw: tuple[int, int],
               camera: Union[CameraKVCache, CameraCacheBatch]) -> StepOutputs:
        """The camera and depth heads over the aggregator's selected layers, then the geometry."""
        H, W = image_hw
        poses = self._camera(outputs, camera)
        depth, depth_conf = self._depth(outputs, H, W)                           # [F, H, W, 1], [F, H, W]
        return self._geometry(poses, depth, depth_conf, W, H)

    def _camera(self, outputs: list[torch.Tensor], camera: Union[CameraKVCache, CameraCacheBatch]) -> torch.Tensor:
        # The heads run in fp32.
        return self.model.camera_head(outputs[-1][:, 0].float(), camera, self.camera_num_iterations)

    def _depth(self, outputs: list[torch.Tensor], H: int, W: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The depth head, DEPTH_HEAD_FRAMES frames at a time: its fp32 feature maps at the image's
        size are ~0.3 GB a frame (released model, 518x378), and phase 1's batch of 8 at once put
        ~1.6 GiB more on top of the steady state at every window's start
        (bench/depth_head_memory.py). Each frame's depth is its own (no cross-frame term): the
        chunks change values by the convolutions' rounding only."""
        return _joined([self._depth_chunk(outputs, i, H, W) for i in range(0, outputs[0].shape[0], DEPTH_HEAD_FRAMES)])

    def _depth_chunk(self, outputs: list[torch.Tensor], first: int, H: int, W: int) -> tuple[torch.Tensor, torch.Tensor]:
        c = DEPTH_HEAD_FRAMES
        return self.model.depth_head([o[first:first + c].float() for o in outputs], H, W)

    @staticmethod
    def _geometry(poses: torch.Tensor, depth: torch.Tensor, depth_conf: torch.Tensor, W: int, H: int) -> StepOutputs:
        extrinsic = pose_to_extrinsic(poses[-1])
        intrinsic = pose_to_intrinsic(poses[-1], W, H)
        points = depth_to_world_points(depth[..., 0], extrinsic, intrinsic)
        return poses, depth, depth_conf, extrinsic, intrinsic, points

    def _autocast(self):
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        # No cast cache: casts made while a CUDA graph is captured must live in the graph's pool.
        return torch.autocast(self.model.device.type, dtype=self.dtype, cache_enabled=False)

    def _kernels(self, num_frames: int, frame_steps: bool):
        """The session's choice for single-frame steps (and for `frame_steps`); phase 1's
        multi-frame batch runs eagerly (once per stream: not worth compiling another shape)."""
        return block_kernels(self.frame_kernels if num_frames == 1 or frame_steps else EAGER_KERNELS)
