"""State that is born sharded: parameters read or initialised straight into a mesh's shardings, cast and
given their optimizer state inside `jit` with `out_shardings`, so no device ever holds more than its share.

Without a mesh (one device) the same functions place everything on the default device.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import optax

from hat_jax.model.params import params_shapes, params_shardings
from hat_jax.model.process_sync import start_together
from hat_jax.train import checkpoints as ckpt
from hat_jax.train.trainer import TrainState, init_train_state


def restore_params(path: str | Path, model_config, mesh, what: str) -> dict:
    """The params of checkpoint `path` (a model checkpoint or a stage's run dir) in their stored dtypes, read
    straight into `mesh`'s shardings (default device without a mesh), checked against `model_config`.

    Args:
        what: how messages name the checkpoint, e.g. "SFT init", "OPD teacher".
    Raises:
        FileNotFoundError: `path` does not exist.
        IncompatibleCheckpointError: unreadable params, another shape (names the first bad leaf), another model
            config (lists the differing fields), or a mesh that cannot shard a parameter (names it).
    """
    from hat_jax.model.checkpoint_io import load_model_checkpoint

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{what} checkpoint {str(path)!r} does not exist")
    try:
        stored_config, params = load_model_checkpoint(path, mesh=mesh)
    except ValueError as err:
        raise ckpt.IncompatibleCheckpointError(f"{what} checkpoint {str(path)!r}: {err}") from err
    ckpt.check_compatible(str(path), "params", params, params_shapes(model_config), check_dtype=False)
    fields = [f for f in model_config.__dataclass_fields__ if f != "extra"]
    diff = [f"{f}: checkpoint {getattr(stored_config, f)!r} != stage {getattr(model_config, f)!r}"
            for f in fields if getattr(stored_config, f) != getattr(model_config, f)]
    if diff:
        raise ckpt.IncompatibleCheckpointError(f"{what} checkpoint {str(path)!r} has another model config: "
                                               + "; ".join(diff[:8]))
    return params


def init_state(params: dict, optimizer: optax.GradientTransformation, rng: jax.Array, param_dtype,
               shardings: TrainState | None) -> TrainState:
    """A fresh TrainState (`init_train_state`) from `params` cast to `param_dtype`, built inside `jit` with
    `out_shardings=shardings` (the stage's `state_shardings`; None: the default device). `params` is donated.

    Returns:
        TrainState: params [param_dtype], optimizer state (moments in the optimizer's dtypes), step 0, rng.
    """
    def build(p, key):
        p = jax.tree_util.tree_map(lambda x: x.astype(param_dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, p)
        return init_train_state(p, optimizer, key)

    return start_together(jax.jit(build, out_shardings=shardings, donate_argnums=0), "sharded_init")(params, rng)


def fresh_params(model_config, seed: int, mesh, param_dtype=jnp.float32) -> dict:
    """`hat_jax.model.params.init_params(model_config, key(seed), param_dtype)` initialised straight into
    `mesh`'s shardings (the default device without a mesh)."""
    from hat_jax.model.params import init_params

    return init_params(model_config, jax.random.key(seed), param_dtype, shardings=params_shardings(model_config, mesh))
