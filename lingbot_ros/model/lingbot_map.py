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


def build_model(cfg: ModelConfig, device="cpu", seed: int = 0) -> LingBotMap:
    """Build in eval mode with random weights (load a checkpoint afterwards)."""
    model = LingBotMap(cfg).init_random(seed)
    return model.to(device).eval().requires_grad_(False)

