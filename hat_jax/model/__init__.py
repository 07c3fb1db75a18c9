"""The qwen3_5_moe model family in pure-functional Flax Linen (see transformer.py for the layout)."""

from hat_jax.model.cache import init_cache
from hat_jax.model.config import PRESETS, Qwen3_5MoeTextConfig, RopeParameters, get_config
from hat_jax.model.params import init_params, param_counts, params_logical_axes, params_shapes
from hat_jax.model.segments import check_segment_ids, segment_positions, segment_starts
from hat_jax.model.transformer import ModelOutput, Qwen3_5MoeForCausalLM

__all__ = [
    "PRESETS", "ModelOutput", "Qwen3_5MoeForCausalLM", "Qwen3_5MoeTextConfig", "RopeParameters", "get_config",
    "check_segment_ids", "init_cache", "init_params", "param_counts", "params_logical_axes", "params_shapes",
    "segment_positions", "segment_starts",
]
