"""The optimizer every stage uses: global-norm clipping, then AdamW on a warmup + cosine schedule.

Variant implemented:
- `optax.chain(clip_by_global_norm(clip_norm), adamw(schedule, b1, b2, eps, weight_decay, mask))`:
  gradients are clipped on their global L2 norm before the Adam moments see them (as nanoGPT and
  Levanter do); AdamW is decoupled weight decay (Loshchilov & Hutter 2019), the decay term scaled by
  the learning rate as in `optax.adamw` and PyTorch's `AdamW`.
- Schedule: `optax.warmup_cosine_decay_schedule(init_value=0, peak_value=lr, warmup_steps,
  decay_steps=total_steps, end_value=lr * min_lr_ratio)`: linear from 0 at step 0 to `lr` at
  `warmup_steps`, then a half cosine to `lr * min_lr_ratio` at `total_steps`, constant after.
  The update of step s (0-based, the optimizer's count before the update) uses `schedule(s)`.
- Weight-decay mask (nanoGPT `configure_optimizers`): every parameter with ndim >= 2 is decayed
  (linear kernels, embeddings, expert tensors, the DeltaNet conv kernel); 1-D parameters are not
  (RMSNorm weights, biases, the DeltaNet per-head `A_log` and `dt_bias`).
"""

from __future__ import annotations

import dataclasses

import jax
import optax


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """AdamW + schedule + clipping settings.

    Attributes:
      lr: peak learning rate. warmup_steps: linear warmup length (0 = start at the peak).
      total_steps: end of the cosine decay (usually the stage's steps).
      min_lr_ratio: final lr as a fraction of `lr`.
      weight_decay: decoupled decay coefficient (applied to ndim >= 2 parameters only).
      b1, b2, eps: Adam moments' decay rates and epsilon.
      clip_norm: global-norm clipping threshold (None or 0 = no clipping).
    """

    lr: float = 3e-4
    warmup_steps: int = 0
    total_steps: int = 1000
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    clip_norm: float | None = 1.0

    def __post_init__(self):
        if self.lr < 0 or self.weight_decay < 0:
            raise ValueError(f"OptimConfig: lr ({self.lr}) and weight_decay ({self.weight_decay}) must be >= 0")
        if self.total_steps < 1 or not 0 <= self.warmup_steps <= self.total_steps:
            raise ValueError(f"OptimConfig: need 0 <= warmup_steps ({self.warmup_steps}) <= total_steps "
                             f"({self.total_steps}) and total_steps >= 1")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"OptimConfig.min_lr_ratio = {self.min_lr_ratio}: expected a value in [0, 1]")


def lr_schedule(config: OptimConfig) -> optax.Schedule:
    """step -> learning rate (see the module docstring). When the warmup spans the whole run
    (warmup_steps == total_steps, e.g. a short run of a preset), there is no cosine part: a linear warmup."""
    if config.warmup_steps == config.total_steps:
        return optax.linear_schedule(0.0, config.lr, config.warmup_steps)
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=config.lr, warmup_steps=config.warmup_steps,
        decay_steps=config.total_steps, end_value=config.lr * config.min_lr_ratio)


def decay_mask(params) -> object:
    """Pytree of bools like `params`: True where weight decay applies (ndim >= 2)."""
    return jax.tree_util.tree_map(lambda p: p.ndim >= 2, params)


def make_optimizer(config: OptimConfig, mu_dtype=None) -> optax.GradientTransformation:
    """clip_by_global_norm (when clip_norm) -> adamw(schedule, weight decay masked by `decay_mask`).

    mu_dtype: dtype of Adam's first moment (None: the params' dtype); the second moment is kept in the params'
    dtype (optax's `scale_by_adam`)."""
    adamw = optax.adamw(lr_schedule(config), b1=config.b1, b2=config.b2, eps=config.eps,
                        weight_decay=config.weight_decay, mask=decay_mask, mu_dtype=mu_dtype)
    if config.clip_norm:
        return optax.chain(optax.clip_by_global_norm(config.clip_norm), adamw)
    return optax.chain(optax.identity(), adamw)
