"""A policy from a checkpoint: its tokenizer folder, and a `JaxSampler` on its params.

A checkpoint is a `hat_jax.model.checkpoint_io` layout (a model checkpoint or a stage's run directory); its
tokenizer is the `tokenizer/` folder in it or in its parent (a stage writes `<run>/tokenizer`, a model
checkpoint inside a run dir finds it one level up).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hat_jax.model.params import COMPUTE_DTYPES
from hat_jax.rollout.sampler import JaxSampler


def tokenizer_from_checkpoint(init: str | Path | None) -> Path | None:
    """The tokenizer folder that comes with a checkpoint (`<ckpt>/tokenizer` or its parent's), or None."""
    if init is None:
        return None
    root = Path(init)
    for folder in (root / "tokenizer", root.parent / "tokenizer"):
        if (folder / "tokenizer.json").is_file():
            return folder
    return None


def load_sampler(ckpt: str | Path, compute_dtype: str = "float32", **options: Any) -> JaxSampler:
    """A `JaxSampler` on the params and tokenizer of checkpoint `ckpt`, computing in `compute_dtype`.

    On one device the params are cast to the model's parameter dtypes and placed, uncommitted, on the default
    device (so they share the sampler's compilations with in-process params); on several, read straight into
    the default mesh's shardings (`hat_jax.model.sharding.default_mesh`) and cast there to the compute dtype.

    Args:
      ckpt: the checkpoint directory. compute_dtype: a key of `COMPUTE_DTYPES`.
      options: further `JaxSampler` fields (bucket, moe_impl).
    Raises:
      FileNotFoundError: no checkpoint or no tokenizer folder (names the paths looked at).
      ValueError: unreadable params, an unknown compute_dtype, or a tokenizer larger than the model's vocabulary.
    """
    from hat_jax.model.checkpoint_io import load_model_checkpoint, resolve_checkpoint
    from hat_jax.model.hf_io import read_hf_config
    from hat_jax.model.params import cast_params, params_shapes
    from hat_jax.model.sharding import default_mesh
    from hat_jax.tokenizer import load_tokenizer

    if compute_dtype not in COMPUTE_DTYPES:
        raise ValueError(f"compute_dtype = {compute_dtype!r}; valid: {sorted(COMPUTE_DTYPES)}")
    root = Path(ckpt)
    folder = tokenizer_from_checkpoint(root)
    if folder is None:
        raise FileNotFoundError(f"checkpoint {str(root)!r} has no tokenizer folder (looked in {root / 'tokenizer'} "
                                f"and {root.parent / 'tokenizer'})")
    dtype = COMPUTE_DTYPES[compute_dtype]
    if jax.device_count() > 1:
        mesh = default_mesh(None, read_hf_config(resolve_checkpoint(root)[1]).num_experts)
        model_config, params = load_model_checkpoint(root, mesh=mesh)
        params = cast_params(params, model_config, dtype, mesh)
    else:
        model_config, params = load_model_checkpoint(root)
        # Through the host: restored arrays are committed to a device, which `jax.jit` keys apart from the
        # uncommitted arrays of in-process params.
        params = jax.tree_util.tree_map(lambda p, e: jnp.asarray(np.asarray(jax.device_get(p)), e.dtype), params,
                                        params_shapes(model_config))
    tokenizer = load_tokenizer(folder)
    if len(tokenizer) > model_config.vocab_size:
        raise ValueError(f"tokenizer {str(folder)!r} has {len(tokenizer)} tokens, more than the model's vocab_size "
                         f"{model_config.vocab_size}")
    return JaxSampler(params, model_config, tokenizer, dtype=dtype, **options)
