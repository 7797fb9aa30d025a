"""Pure functional model definitions (Kimi K2.6 target, DFlash draft): parameters are dicts of
tensors; functions take params, config and state and return outputs and new state."""

from . import dflash
from .config import DFlashConfig, KimiK2Config, dflash_tiny, kimi_k26, kimi_k26_dflash, kimi_tiny
from .kimi_k2 import init_params, prefill, verify
from .loading import load_dflash_params, load_params

__all__ = ["KimiK2Config", "kimi_k26", "kimi_tiny", "init_params", "load_params", "prefill", "verify",
           "DFlashConfig", "kimi_k26_dflash", "dflash_tiny", "dflash", "load_dflash_params"]
