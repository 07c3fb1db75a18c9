"""Pure parameter creation, inspection and placement: `init_params`, `tied_lm_head`, `params_logical_axes`,
`param_counts`, `params_shardings`, `cast_params`, and the dtype names configs use (`COMPUTE_DTYPES`)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from hat_jax.model.config import Qwen3_5MoeTextConfig
from hat_jax.model.sharding import logical_to_mesh
from hat_jax.model.transformer import Qwen3_5MoeForCausalLM

# The dtype names a config may give (compute, parameter and optimizer-moment dtypes).
COMPUTE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}

# Names the initialisation below. Part of a pretrained-from-scratch base's identity (`hat_jax.train.pretrain`
# digests it with the config), so a base cached under an earlier scheme is retrained, not reused.
INIT_SCHEME = "transformers-init_weights+fla-dt_bias+zero-gdn-out_proj"


def _boxed_init(config: Qwen3_5MoeTextConfig, rng: jax.Array, param_dtype):
    model = Qwen3_5MoeForCausalLM(config, param_dtype=param_dtype)
    ids = jnp.zeros((1, 2), jnp.int32)
    return model.init(rng, ids)["params"]


# `init_params(lm_head_init=...)`: "normal" is transformers' N(0, initializer_range); "embedding" starts the untied
# lm_head as the transpose of the token embedding.
LM_HEAD_INITS = ("normal", "embedding")


def _init(config: Qwen3_5MoeTextConfig, rng: jax.Array, param_dtype, lm_head_init: str) -> dict:
    params = nn.unbox(_boxed_init(config, rng, param_dtype))
    return tied_lm_head(params) if lm_head_init == "embedding" else params


def init_params(config: Qwen3_5MoeTextConfig, rng: jax.Array, param_dtype=jnp.float32, shardings=None,
                lm_head_init: str = "normal") -> dict:
    """Freshly initialised parameters: a plain nested dict of arrays (no boxing); with `shardings` (a tree of
    NamedShardings like the params) each is created straight in its shards.

    Init follows transformers' `_init_weights`: linear/embedding/experts ~ N(0, initializer_range),
    zero-centred norms 0, DeltaNet gated norm 1, A_log = log U(0.01, 16), conv ~ torch default; except two
    Gated DeltaNet parameters, which matter only when training from scratch (a pretrained base overwrites both):
    - dt_bias follows the Gated DeltaNet authors' from-scratch init (softplus(dt_bias) ~ logU(1e-3, 0.1);
      `hat_jax.model.deltanet._dt_bias_init` says why);
    - out_proj is zero (`hat_jax.model.deltanet.OUT_PROJ_INIT_STD`), so each DeltaNet residual branch starts as
      the identity: the "zero" residual strategy of fla-org/flash-linear-attention's `_init_weights`, applied to
      the DeltaNet layers only. Its input is the gated RMSNorm's unit-RMS output whatever the layer's input, so
      with N(0, 0.02) each DeltaNet layer adds a mix of earlier tokens of RMS ~0.022 to the residual stream, as
      large as the embedding (0.020), and the tiny hybrid model does not learn to copy from its context in 300
      steps (`experiments/benchmarks/copy_task.py`: copy accuracy 0.03 vs 1.00 after 300 steps; zeroing the
      attention and expert output projections too is as slow as neither).
    `INIT_SCHEME` names this scheme.

    `lm_head_init="embedding"` (`LM_HEAD_INITS`) starts the lm_head kernel [H, V] as the embedding's transpose; the
    two still train apart (the architecture's lm_head is untied). A from-scratch model then scores a token's own
    embedding highest from the first step, so copying a token from the context needs no per-token training of its
    output row: on the span task over 3,000 distinct names the tiny model copies the first token in 0.88 of rows
    at step 75 and 1.00 at step 200, and never within 400 steps with "normal" (docs/tuning.md, "Copying rare
    tokens"). Press & Wolf (2017), "Using the Output Embedding to Improve Language Models", tie the two throughout.

    Raises:
      ValueError: `lm_head_init` not in `LM_HEAD_INITS`.
    """
    if lm_head_init not in LM_HEAD_INITS:
        raise ValueError(f"init_params: lm_head_init = {lm_head_init!r}; expected one of {LM_HEAD_INITS}")
    if shardings is None:
        return jax.jit(_init, static_argnums=(0, 2, 3))(config, rng, param_dtype, lm_head_init)
    return jax.jit(lambda r: _init(config, r, param_dtype, lm_head_init), out_shardings=shardings)(rng)


def tied_lm_head(params: dict) -> dict:
    """`params` with the lm_head kernel [H, V] replaced by the token embedding [V, H] transposed (same dtype): the
    two weights as one matrix (weight tying, Press & Wolf 2017), for training a from-scratch base whose lm_head is
    the embedding's transpose at every step (`hat_jax.train.trainer.make_train_step(tie_lm_head=True)`). The
    architecture keeps both arrays; a model trained tied has them equal."""
    return {**params, "lm_head": {**params["lm_head"], "kernel": params["model"]["embed_tokens"]["embedding"].T}}


def params_logical_axes(config: Qwen3_5MoeTextConfig) -> dict:
    """Pytree (same structure as `init_params`) of PartitionSpecs of logical axis names. No FLOPs."""
    boxed = jax.eval_shape(lambda r: _boxed_init(config, r, jnp.float32), jax.random.key(0))
    return nn.get_partition_spec(boxed)


def params_shapes(config: Qwen3_5MoeTextConfig, param_dtype=jnp.float32) -> dict:
    """Pytree of ShapeDtypeStructs of the parameters (no allocation)."""
    return nn.unbox(jax.eval_shape(lambda r: _boxed_init(config, r, param_dtype), jax.random.key(0)))


def param_counts(config: Qwen3_5MoeTextConfig) -> dict[str, int]:
    """Parameter counts: 'total' (main model, as transformers' `Qwen3_5MoeForCausalLM`), 'mtp', 'experts'
    (routed experts of the main model), 'active' (per token: everything but the unused routed experts,
    i.e. total - experts * (1 - k/E); embeddings and lm_head included, as in the model card's 35B total / 3B active)
    and 'mtp_active' (the MTP block's parameters per token, its unused routed experts left out likewise)."""
    shapes = params_shapes(config)
    size = lambda tree: int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(tree)))
    routed = lambda layers: size([layer["mlp"]["experts"] for name, layer in layers.items()
                                  if name.startswith("layers_")])
    active_share = lambda n: n * config.num_experts_per_tok // config.num_experts
    mtp_tree = shapes.get("mtp", {})
    mtp = size(mtp_tree)
    total = size(shapes) - mtp
    experts = routed(shapes["model"])
    active = total - experts + active_share(experts)
    mtp_experts = routed(mtp_tree)
    mtp_active = mtp - mtp_experts + active_share(mtp_experts)
    return {"total": total, "mtp": mtp, "experts": experts, "active": active, "mtp_active": mtp_active}


def params_shardings(config: Qwen3_5MoeTextConfig, mesh):
    """NamedShardings of the model's params on `mesh` (`hat_jax.model.sharding` rules), or None (no mesh).

    Raises:
        ValueError: a parameter the mesh cannot shard (names the parameter, its shape and the mesh).
    """
    if mesh is None:
        return None
    return logical_to_mesh(params_logical_axes(config), params_shapes(config), mesh)


def cast_params(params: dict, config: Qwen3_5MoeTextConfig, dtype, mesh) -> dict:
    """`params` cast to the model's param dtypes at `dtype` (float32 / bfloat16), inside `jit` with
    out_shardings on `mesh` (or the default device): each device casts its own shards. `params` is donated."""
    target = params_shapes(config, dtype)
    fn = jax.jit(lambda p: jax.tree_util.tree_map(lambda x, t: x.astype(t.dtype), p, target),
                 out_shardings=params_shardings(config, mesh), donate_argnums=0)
    return fn(params)
