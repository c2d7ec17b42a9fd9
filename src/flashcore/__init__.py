"""flashcore: fused attention kernels for NVIDIA Hopper, with a constant-time (DHP-safe) mode."""
from . import reference
from ._checks import NotConstantTimeWarning
from .api import attention, attention_varlen, attention_with_kvcache, kvcache_step, plan_attention
from .kvcache_step import KVCacheStep

__version__ = "0.1.0"
__all__ = ["attention", "attention_varlen", "attention_with_kvcache", "kvcache_step", "KVCacheStep", "plan_attention",
           "reference", "NotConstantTimeWarning", "__version__"]
