"""The LingBot-Map network (spec 1.1): aggregator + camera head + DPT depth head."""
from __future__ import annotations

import torch
from torch import nn

from .aggregator import Aggregator
from .camera_head import CameraHead
from .config import ModelConfig
from .dpt_head import DPTHead


class LingBotMap(nn.Module):
    """Stateless: the streaming session owns every cache and passes it in per call."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.aggregator = Aggregator(cfg)
        self.camera_head = CameraHead(cfg)
        self.depth_head = DPTHead(cfg)
        self.matmul_dtype = torch.float32   # dtype of the aggregator's linear/conv weights

    def store_matmul_weights(self, dtype: torch.dtype) -> "LingBotMap":
        """Keep the aggregator's linear and convolution weights (and biases) in `dtype`, for
        inference under autocast to that dtype: autocast would round the float32 masters to the
        same values at every call (frozen weights are not in its cast cache), a full pass over
        the weights per frame. Outputs do not change; the weights' memory halves. LayerNorms,
        LayerScales, tokens and both heads stay float32. Call after loading the checkpoint.
        float32 keeps float32 weights as they are (rounded weights cannot be restored)."""
        if dtype == self.matmul_dtype:
            return self
        if dtype not in (torch.bfloat16, torch.float16) or self.matmul_dtype != torch.float32:
            raise ValueError(f"cannot store matmul weights held in {self.matmul_dtype} as {dtype}; "
                             "build the model again")
        for module in self.aggregator.modules():
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                module.to(dtype)
        self.matmul_dtype = dtype
        return self

    @torch.no_grad()
    def init_random(self, seed: int = 0) -> "LingBotMap":
        """Well-scaled random weights (benchmarks and tests without a checkpoint)."""
        g = torch.Generator().manual_seed(seed)

        def normal(p, std, mean=0.0):
            p.copy_(torch.randn(p.shape, generator=g) * std + mean)

        for name, p in self.named_parameters():
            if name.endswith("gamma"):
                normal(p, 0.05, 0.3)
            elif p.dim() == 1 and ("norm" in name):
                normal(p, 0.05, 1.0 if name.endswith("weight") else 0.0)
            elif p.dim() == 1:
                normal(p, 0.02)
            elif "token" in name or "pos_embed" in name:
                normal(p, 0.5)
            else:   # weights: unit-variance outputs for unit-variance inputs
                normal(p, p[0].numel() ** -0.5)           # p[0].numel() = fan-in
        return self

    @property
    def device(self) -> torch.device:
        return self.aggregator.camera_token.device


def build_model(cfg: ModelConfig, device="cpu", seed: int = 0, random_init: bool = True) -> LingBotMap:
    """Build in eval mode with frozen weights.

    random_init=True: the well-scaled random weights of `init_random` (seeded on the CPU, so the
    same on every device). False when a checkpoint will overwrite the weights (load_checkpoint
    refuses one that misses any weight the model uses): the modules are then created directly on
    `device` with PyTorch's default initialisation, skipping the slow CPU pass over 1.16 B weights.
    """
    if random_init:
        model = LingBotMap(cfg).init_random(seed).to(device)
    else:
        with torch.device(device):
            model = LingBotMap(cfg)
    return model.eval().requires_grad_(False)
