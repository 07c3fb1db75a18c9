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

MAX_LR = 1.0  # a peak learning rate above this diverges any model here within a few steps (checked at parse time)


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """AdamW + schedule + clipping settings.

    Attributes:
      lr: peak learning rate. warmup_steps: linear warmup length (0 = start at the peak).
      total_steps: end of the cosine decay; None = the stage's optimizer updates (`resolve`), the warmup then
        capped at them.
      min_lr_ratio: final lr as a fraction of `lr`.
      weight_decay: decoupled decay coefficient (applied to ndim >= 2 parameters only).
      b1, b2, eps: Adam moments' decay rates and epsilon.
      clip_norm: global-norm clipping threshold (None or 0 = no clipping).
    Raises:
      ValueError (at construction, so a bad --set is refused before anything runs): a field outside its range,
        naming it: lr in [0, MAX_LR], weight_decay, min_lr_ratio, b1, b2, eps in [0, 1], clip_norm >= 0, all
        finite; warmup_steps >= 0; total_steps None or >= max(1, warmup_steps).
    """

    lr: float = 3e-4
    warmup_steps: int = 0
    total_steps: int | None = None
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    clip_norm: float | None = 1.0

    def __post_init__(self):
        ranges = {"lr": (0.0, MAX_LR), "weight_decay": (0.0, 1.0), "min_lr_ratio": (0.0, 1.0), "b1": (0.0, 1.0),
                  "b2": (0.0, 1.0), "eps": (0.0, 1.0)}
        for name, (low, high) in ranges.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
                raise ValueError(f"OptimConfig.{name} = {value!r}: expected a finite number in [{low:g}, {high:g}]")
        clip = self.clip_norm
        if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float)) or not 0 <= clip <= 1e30):
            raise ValueError(f"OptimConfig.clip_norm = {self.clip_norm!r}: expected null or a finite number >= 0")
        if self.warmup_steps < 0 or (self.total_steps is not None and
                                     (self.total_steps < 1 or self.warmup_steps > self.total_steps)):
            raise ValueError(f"OptimConfig: need 0 <= warmup_steps ({self.warmup_steps}) <= total_steps "
                             f"({self.total_steps}) and total_steps >= 1 (or null: the stage's updates)")

    def resolve(self, updates: int) -> "OptimConfig":
        """This config with its schedule's end set: total_steps, or `updates` (the stage's optimizer updates) when
        it is None, with warmup_steps capped at it. Raises ValueError when `updates` < 1."""
        if updates < 1:
            raise ValueError(f"OptimConfig.resolve: {updates} updates, expected >= 1")
        if self.total_steps is not None:
            return self
        return dataclasses.replace(self, total_steps=updates, warmup_steps=min(self.warmup_steps, updates))


def _resolved(config: OptimConfig) -> OptimConfig:
    if config.total_steps is None:
        raise ValueError("OptimConfig.total_steps is None (the stage's updates): resolve it first, "
                         "config.optim.resolve(config.updates)")
    return config


def lr_schedule(config: OptimConfig) -> optax.Schedule:
    """step -> learning rate (see the module docstring). When the warmup spans the whole run
    (warmup_steps == total_steps, e.g. a short run of a preset), there is no cosine part: a linear warmup.
    Raises ValueError when total_steps is None (not resolved)."""
    config = _resolved(config)
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
    dtype (optax's `scale_by_adam`). Raises ValueError when total_steps is None (not resolved)."""
    config = _resolved(config)
    adamw = optax.adamw(lr_schedule(config), b1=config.b1, b2=config.b2, eps=config.eps,
                        weight_decay=config.weight_decay, mask=decay_mask, mu_dtype=mu_dtype)
    if config.clip_norm:
        return optax.chain(optax.clip_by_global_norm(config.clip_norm), adamw)
    return optax.chain(optax.identity(), adamw)
