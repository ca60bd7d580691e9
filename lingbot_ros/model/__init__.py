"""The LingBot-Map network: config presets, modules, checkpoint loading, pose geometry."""
from .checkpoint import CheckpointError, load_checkpoint
from .config import ConfigError, ModelConfig
from .lingbot_map import LingBotMap, build_model

__all__ = ["CheckpointError", "ConfigError", "LingBotMap", "ModelConfig", "build_model", "load_checkpoint"]
