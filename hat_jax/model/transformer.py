"""The qwen3_5_moe causal LM (transformers `Qwen3_5MoeForCausalLM`) plus its MTP block (vLLM
`Qwen3_5MoeMTP`), as Flax Linen modules with pure `init`/`apply`.

Parameter tree (names mirror the Hugging Face state dict, so `hat_jax.model.hf_io` maps them 1:1):
    model/embed_tokens/embedding [V, H]
    model/layers_{i}/input_layernorm/weight, post_attention_layernorm/weight
    model/layers_{i}/linear_attn/...   (Gated DeltaNet layers)   or   model/layers_{i}/self_attn/...
    model/layers_{i}/mlp/{gate, experts, shared_expert, shared_expert_gate}
    model/norm/weight
    lm_head/kernel [H, V]
    mtp/{pre_fc_norm_embedding, pre_fc_norm_hidden, fc, layers_0, norm}   (when mtp_num_hidden_layers=1)

Decoder layer (pre-norm): h = x + Mixer(norm_in(x)); out = h + MoE(norm_post(h)).
MTP (vLLM `Qwen3_5MultiTokenPredictor.forward`): x = fc(cat[norm_e(embed(tok_{t+1})), norm_h(h_t)]), one
full-attention decoder layer with MoE, a final norm, the shared lm_head; h_t is the main model's
post-final-norm hidden state and positions stay those of h_t. Its logits at t predict token t+2.

Packed rows (`segment_ids`, `hat_jax.model.segments`): attention is causal within a document, the Gated
DeltaNet state and conv restart at each document, RoPE and the MTP layer use per-document positions, and
the MTP block's next-token input at a document's last token is the padding id 0 (as at a row's end), so a
packed row computes exactly what its documents give run separately.

Router outputs: by default every decoder layer returns its [B*T, E] router logits, stacked to [L, B*T, E];
with `router_stats=True` each layer instead reduces them to the sums the MoE losses need
(`hat_jax.model.router_stats.RouterStats`, [L, E]-sized) over the call's token mask, so no [L, B*T, E]
array (or its gradient) leaves the layers. The MTP layer always returns its logits.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from hat_jax.model.attention import GatedAttention
from hat_jax.model.cache import cache_positions, check_cache_room
from hat_jax.model.config import FULL_ATTENTION, LINEAR_ATTENTION, Qwen3_5MoeTextConfig
from hat_jax.model.deltanet import GatedDeltaNet
from hat_jax.model.linear import Linear
from hat_jax.model.moe import SparseMoeBlock
from hat_jax.model.norms import RMSNorm
from hat_jax.model.rope import rope_cos_sin
from hat_jax.model.router_stats import RouterStats, router_stats
from hat_jax.model.segments import token_mask_of, uncached_inputs
from hat_jax.model.sharding import constrain

# [B, T, H] activations: rows over the mesh's batch axes, the length over 'context', hidden whole (`constrain`)
ACTIVATION = ("batch", "length", None)


@flax.struct.dataclass
class ModelOutput:
    """logits: [B, T, V] compute dtype (None when not requested); hidden: [B, T, H] post-final-norm;
    router_logits: [L, B*T, E] float32 (None with `router_stats=True`); expert_ids: [L, B*T, k] int32;
    cache: updated cache or None; mtp_logits: [B, T, V] (position t predicts token t+2) when requested with
    `with_mtp=True` (None with `return_logits=False`); mtp_hidden: [B, T, H] the MTP block's post-norm output
    (the lm_head input of mtp_logits) with `with_mtp=True`; mtp_router_logits: [1, B*T, E] float32 with them;
    router_stats: with
    `router_stats=True`, the per-layer sums over non-padding tokens (`RouterStats`: counts and prob_sums
    [L, E], lse_sq_sum and tokens [L]), else None."""

    logits: jax.Array | None
    hidden: jax.Array
    router_logits: jax.Array
    expert_ids: jax.Array
    cache: Any = None
    mtp_logits: jax.Array | None = None
    mtp_router_logits: jax.Array | None = None
    router_stats: RouterStats | None = None
    mtp_hidden: jax.Array | None = None


def _stack(trees: list) -> Any:
    """Per-layer arrays (or `RouterStats`) stacked on a new leading layer axis."""
    return jax.tree_util.tree_map(lambda *a: jnp.stack(a), *trees)


def _concat(trees: list) -> Any:
    """[n, ...] per-layer stacks (arrays or `RouterStats`) joined on their leading layer axis."""
    return jax.tree_util.tree_map(lambda *a: jnp.concatenate(a), *trees)


class DecoderLayer(nn.Module):
    config: Qwen3_5MoeTextConfig
    layer_type: str
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    moe_impl: str = "blocked"
    attention_impl: str = "xla"
    moe_token_chunk: int | None = None
    router_stats: bool = False  # return `RouterStats` of the router logits over token_mask instead of them
    cache_steps: bool = False  # Gated DeltaNet: return the cache after every token (`GatedDeltaNet`)

    @nn.compact
    def __call__(self, x, cos, sin, token_mask, q_segment_ids, kv_segment_ids, segment_ids=None, cache=None,
                 index=None, forced_expert_ids=None):
        """
        Args:
            x: [B, T, H]. cos, sin: [B, T, rotary_dim]. token_mask: [B, T] bool (False = padding).
            q_segment_ids: [B, T] int32, kv_segment_ids: [B, S] int32: the attention's segments
                (`hat_jax.model.attention.attention`).
            segment_ids: [B, T] int32 of a packed row (Gated DeltaNet resets), None for an unpacked row.
            cache: this layer's cache or None. index: the cache slot of the first token.
            forced_expert_ids: optional [B*T, k] int32.
        Returns:
            (x [B, T, H], new cache or None, router_logits [B*T, E] float32 (with `router_stats`: their
            `RouterStats` over token_mask, [E]-sized), expert_ids [B*T, k]).
        """
        c = self.config
        x = constrain(x, ACTIVATION)
        h = RMSNorm(c.rms_norm_eps, self.param_dtype, name="input_layernorm")(x)
        if self.layer_type == LINEAR_ATTENTION:
            h, new_cache = GatedDeltaNet(c, self.dtype, self.param_dtype, self.cache_steps, name="linear_attn")(
                h, token_mask, cache, segment_ids)
        else:
            h, new_cache = GatedAttention(c, self.dtype, self.param_dtype, self.attention_impl, name="self_attn")(
                h, cos, sin, q_segment_ids, kv_segment_ids, cache, index, packed=segment_ids is not None)
        x = x + constrain(h, ACTIVATION)
        h = RMSNorm(c.rms_norm_eps, self.param_dtype, name="post_attention_layernorm")(x)
        h, router_logits, expert_ids = SparseMoeBlock(c, self.dtype, self.param_dtype, self.moe_impl,
                                                       self.moe_token_chunk, name="mlp")(
            h, forced_expert_ids)
        if self.router_stats:
            router_logits = router_stats(router_logits, c.num_experts_per_tok, token_mask)
        return constrain(x + h, ACTIVATION), new_cache, router_logits, expert_ids


REMAT_POLICIES: dict[str, Any] = {
    "none": None,  # no rematerialisation: the backward pass keeps every activation
    "full": jax.checkpoint_policies.nothing_saveable,  # keep each layer's input only, recompute the rest
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
    "dots_with_no_batch_dims_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "save_layer_outputs": jax.checkpoint_policies.save_only_these_names("layer_output"),
}


def check_remat_policy(policy: str, field: str = "remat_policy") -> str:
    """Returns `policy` when it names a `REMAT_POLICIES` entry.

    Raises:
        ValueError: naming `field` and listing the valid policies.
    """
    if policy not in REMAT_POLICIES:
        raise ValueError(f"{field} = {policy!r}: expected one of {sorted(REMAT_POLICIES)}")
    return policy


def layer_block(layer_types: tuple[str, ...]) -> int:
    """The length p of the repeating layer pattern: the smallest p with layer_types[i] == layer_types[i % p]
    for every i (4 for 3 Gated DeltaNet + 1 attention layers; the last L mod p layers are a partial block)."""
    n = len(layer_types)
    for p in range(1, n + 1):
        if all(layer_types[i] == layer_types[i % p] for i in range(n)):
            return p
    return max(n, 1)


class TextModel(nn.Module):
    """Embedding, decoder layers, final norm. Uncached calls with `scan_layers` run `jax.lax.scan` over the
    blocks of the repeating layer pattern (`layer_block`): the per-layer params of each block position are
    stacked inside the forward pass (the parameter tree keeps its `layers_{i}` names), the last L mod p
    layers run unscanned after the scan. Cached calls (decoding) and `init` use the Python loop over layers.
    `remat_policy` (a `REMAT_POLICIES` key) rematerialises each decoder layer, scanned or not."""

    config: Qwen3_5MoeTextConfig
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    moe_impl: str = "blocked"
    remat_policy: str = "none"
    scan_layers: bool = False
    attention_impl: str = "xla"
    moe_token_chunk: int | None = None
    router_stats: bool = False
    cache_steps: bool = False

    def setup(self):
        c = self.config
        check_remat_policy(self.remat_policy)
        self.embed_tokens = nn.Embed(
            c.vocab_size, c.hidden_size, dtype=self.dtype, param_dtype=self.param_dtype,
            embedding_init=nn.with_logical_partitioning(nn.initializers.normal(c.initializer_range), ("vocab", "embed")))
        layer_cls = DecoderLayer
        if self.remat_policy != "none":
            layer_cls = nn.remat(DecoderLayer, static_argnums=(), prevent_cse=not self.scan_layers,
                                 policy=REMAT_POLICIES[self.remat_policy])
        self.layers = [layer_cls(c, t, self.dtype, self.param_dtype, self.moe_impl, self.attention_impl,
                                 self.moe_token_chunk, self.router_stats, self.cache_steps, name=f"layers_{i}")
                       for i, t in enumerate(c.layer_types)]
        self.norm = RMSNorm(c.rms_norm_eps, self.param_dtype)

    def __call__(self, input_ids, cos, sin, token_mask, q_segment_ids, kv_segment_ids, segment_ids=None,
                 cache=None, index=None, forced_expert_ids=None):
        """Arguments as `DecoderLayer`, with input_ids [B, T] int32, cache a list of layer caches, and
        forced_expert_ids [L, B*T, k]. Returns (hidden [B, T, H], layer caches, router_logits [L, B*T, E] (with
        `router_stats`: `RouterStats` with leading dim L), expert_ids [L, B*T, k])."""
        x = constrain(self.embed_tokens(input_ids), ACTIVATION)
        if self.scan_layers and cache is None and not self.is_initializing():
            x, all_logits, all_ids = self._scanned(x, cos, sin, token_mask, q_segment_ids, kv_segment_ids,
                                                   segment_ids, forced_expert_ids)
            return self.norm(x), [None] * len(self.layers), all_logits, all_ids
        new_layers, all_logits, all_ids = [], [], []
        for i, layer in enumerate(self.layers):
            forced = None if forced_expert_ids is None else forced_expert_ids[i]
            layer_cache = None if cache is None else cache[i]
            x, new_cache, logits, ids = layer(x, cos, sin, token_mask, q_segment_ids, kv_segment_ids, segment_ids,
                                              layer_cache, index, forced)
            new_layers.append(new_cache)
            all_logits.append(logits)
            all_ids.append(ids)
        return self.norm(x), new_layers, _stack(all_logits), jnp.stack(all_ids)

    def _scanned(self, x, cos, sin, token_mask, q_seg, kv_seg, segment_ids, forced_expert_ids):
        """The uncached layers as a scan over blocks: (x [B, T, H], router_logits [L, B*T, E] or `RouterStats`,
        expert_ids [L, B*T, k]); equal to the Python loop (tests/model/test_scan.py)."""
        c = self.config
        types = tuple(c.layer_types)
        n, p = len(types), layer_block(types)
        n_blocks = n // p
        params = self.variables["params"]
        policy = REMAT_POLICIES[self.remat_policy]

        def layer_fn(layer_type):
            module = DecoderLayer(c, layer_type, self.dtype, self.param_dtype, self.moe_impl, self.attention_impl,
                                  self.moe_token_chunk, self.router_stats, parent=None)

            def run(lp, h, forced):
                out, _, logits, ids = module.apply({"params": lp}, h, cos, sin, token_mask, q_seg, kv_seg,
                                                   segment_ids, None, None, forced)
                return checkpoint_name(out, "layer_output"), logits, ids

            return run if self.remat_policy == "none" else jax.checkpoint(run, policy=policy, prevent_cse=False)

        fns = [layer_fn(t) for t in types[:p]]

        def block(h, xs):
            block_params, forced = xs
            logits, ids = [], []
            for j in range(p):
                h, lg, ei = fns[j](block_params[j], h, None if forced is None else forced[j])
                logits.append(lg)
                ids.append(ei)
            return h, (_stack(logits), jnp.stack(ids))

        all_logits, all_ids = [], []
        if n_blocks:
            stacked = [jax.tree_util.tree_map(lambda *a: _stack_for_compute(a, self.dtype),
                                              *[params[f"layers_{b * p + j}"] for b in range(n_blocks)])
                       for j in range(p)]
            forced = None
            if forced_expert_ids is not None:
                forced = forced_expert_ids[:n_blocks * p].reshape(n_blocks, p, *forced_expert_ids.shape[1:])
            x, (lg, ei) = jax.lax.scan(block, x, (stacked, forced))
            all_logits.append(jax.tree_util.tree_map(lambda a: a.reshape(n_blocks * p, *a.shape[2:]), lg))
            all_ids.append(ei.reshape(n_blocks * p, *ei.shape[2:]))
        for i in range(n_blocks * p, n):
            forced = None if forced_expert_ids is None else forced_expert_ids[i]
            x, lg, ei = layer_fn(types[i])(params[f"layers_{i}"], x, forced)
            all_logits.append(jax.tree_util.tree_map(lambda a: a[None], lg))
            all_ids.append(ei[None])
        return x, _concat(all_logits), jnp.concatenate(all_ids)


def _stack_for_compute(leaves, dtype) -> jax.Array:
    """The scan's [n_blocks, ...] copy of one parameter across blocks. Matrices (ndim >= 2: every kernel, the
    experts, the conv) are cast to the compute dtype first, as each layer casts them at use anyway: the same
    values, but the stacked copy and its gradient take half the bytes in bf16. Vectors (norm weights, A_log,
    dt_bias, used in float32) keep their dtype."""
    return jnp.stack([a.astype(dtype) if a.ndim >= 2 else a for a in leaves])


class MultiTokenPredictor(nn.Module):
    """The `mtp.*` block. Shares `embed_tokens` and `lm_head` with the main model (passed in). `remat_policy`
    rematerialises its decoder layer as the main model's (same parameter names)."""

    config: Qwen3_5MoeTextConfig
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    moe_impl: str = "blocked"
    attention_impl: str = "xla"
    moe_token_chunk: int | None = None
    remat_policy: str = "none"

    @nn.compact
    def __call__(self, next_embeds, hidden, cos, sin, token_mask, q_segment_ids, kv_segment_ids, packed=True,
                 cache=None, index=None):
        """Arguments as `DecoderLayer` (cache: the MTP layer's {'k', 'v'} or None); next_embeds, hidden
        [B, T, H]. Returns (x [B, T, H] post-norm, router_logits [B*T, E]), and the new cache with one."""
        c = self.config
        e = RMSNorm(c.rms_norm_eps, self.param_dtype, name="pre_fc_norm_embedding")(next_embeds)
        h = RMSNorm(c.rms_norm_eps, self.param_dtype, name="pre_fc_norm_hidden")(hidden)
        x = Linear(c.hidden_size, ("mtp_fc_in", "embed"), self.dtype, self.param_dtype, c.initializer_range,
                   name="fc")(constrain(jnp.concatenate([e, h], axis=-1), ACTIVATION))
        layer_cls = DecoderLayer
        if self.remat_policy != "none":
            layer_cls = nn.remat(DecoderLayer, static_argnums=(), policy=REMAT_POLICIES[self.remat_policy])
        # segment_ids stands in for "packed" only (the full-attention layer has no Gated DeltaNet)
        if cache is not None:  # cached (speculative drafting): no backward pass, nothing to rematerialise
            layer_cls = DecoderLayer
        x, new_cache, router_logits, _ = layer_cls(c, FULL_ATTENTION, self.dtype, self.param_dtype, self.moe_impl,
                                                   self.attention_impl, self.moe_token_chunk, name="layers_0")(
            *(x, cos, sin, token_mask, q_segment_ids, kv_segment_ids, q_segment_ids if packed else None),
            *(() if cache is None else (cache, index)))
        x = RMSNorm(c.rms_norm_eps, self.param_dtype, name="norm")(x)
        return (x, router_logits) if cache is None else (x, router_logits, new_cache)


class Qwen3_5MoeForCausalLM(nn.Module):
    """The model. `dtype` is the compute dtype, `param_dtype` the dtype of freshly initialised params
    (imported params keep their own dtypes). `moe_impl`: 'blocked', 'ragged_dot' or 'dense'
    (`hat_jax.model.moe`). `remat_policy`: a `REMAT_POLICIES` key, how each decoder layer is rematerialised
    in the backward pass ("none": not at all). `scan_layers`: uncached forwards scan over the blocks of the
    repeating layer pattern (`TextModel`; compile time flat in depth); same results as the loop.
    `attention_impl`: 'xla', 'splash', 'cudnn' or 'auto' (`hat_jax.model.attention.attention`).
    `moe_token_chunk`: None, or the MoE dispatch run on chunks of this many tokens per device in a
    rematerialised scan (`hat_jax.model.moe.routed_experts`; smaller MoE buffers, same results).
    `router_stats`: the output carries each layer's `RouterStats` over the token mask (the MoE losses' sums,
    [L, E]-sized) instead of the [L, B*T, E] router logits (module docstring; the stages train with it).
    `cache_steps`: a cached call returns each Gated DeltaNet layer's cache after every token (`GatedDeltaNet`;
    speculative decoding, `hat_jax.model.speculative`)."""

    config: Qwen3_5MoeTextConfig
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    moe_impl: str = "blocked"
    remat_policy: str = "none"
    scan_layers: bool = False
    attention_impl: str = "xla"
    moe_token_chunk: int | None = None
    router_stats: bool = False
    cache_steps: bool = False

    def setup(self):
        c = self.config
        self.model = TextModel(c, self.dtype, self.param_dtype, self.moe_impl, self.remat_policy, self.scan_layers,
                               self.attention_impl, self.moe_token_chunk, self.router_stats, self.cache_steps)
        self.lm_head = Linear(c.vocab_size, ("embed", "vocab"), self.dtype, self.param_dtype, c.initializer_range)
        if c.mtp_num_hidden_layers:
            self.mtp = MultiTokenPredictor(c, self.dtype, self.param_dtype, self.moe_impl, self.attention_impl,
                                           self.moe_token_chunk, self.remat_policy)

    def __call__(self, input_ids, attention_mask=None, positions=None, cache=None, forced_expert_ids=None,
                 return_logits: bool = True, with_mtp: bool = False, segment_ids=None,
                 mtp_detach_trunk: bool = False) -> ModelOutput:
        """Forward pass.

        Args:
            input_ids: [B, T] int32.
            attention_mask: [B, T] bool/int (1 = real token) or None (all real). Padding may be on either
                side; left padding is what batched decoding uses. None when `segment_ids` is given.
            positions: [B, T] int32 or None: then the count of real tokens before each token (equals
                arange(T) without padding), taking the cache's earlier tokens into account; with
                `segment_ids`, the per-document positions (`segment_positions`).
            cache: None (full causal forward) or a cache from `hat_jax.model.cache.init_cache`. Its `index`
                may be a static Python int (e.g. 0 for a prefill inside a jitted function): the attention
                then skips the masked upper triangle (`causal_gqa_attention`); the result is the same.
            forced_expert_ids: optional [L, B*T, k] int32 (routing replay).
            return_logits: False skips the lm_head, the MTP block's too (losses that chunk the vocabulary use
                `hidden` and `mtp_hidden`).
            with_mtp: also run the MTP block on (hidden_t, input_ids_{t+1}) for the MTP training loss; the
                last position (and with `segment_ids` each document's last token) gets the padding
                next-token id 0 and must be masked by the loss (`mtp_loss`).
            segment_ids: [B, T] int32 or None: packed rows (0 = padding, 1..n = the row's documents,
                `hat_jax.model.segments`; validate on the host with `check_segment_ids`). The token mask is
                `segment_ids > 0`; attention is causal within a document and the Gated DeltaNet state and
                conv restart at each document. Training and uncached prefill only.
            mtp_detach_trunk: with `with_mtp`, the MTP block reads h_t and the token embeddings under
                `stop_gradient`, so a loss on its output trains the `mtp.*` params only (`mtp_hidden`).
        Returns:
            ModelOutput.
        Raises:
            ValueError when `segment_ids` comes with an `attention_mask` or a `cache`.
        """
        c = self.config
        t = input_ids.shape[1]
        index = layer_caches = None
        if cache is None:
            token_mask, q_seg, kv_seg, segment_ids, positions = uncached_inputs(
                input_ids, attention_mask, segment_ids, positions)
        elif segment_ids is not None:
            raise ValueError("segment_ids with a cache is not supported (a cache row holds one sequence); "
                             "expected cache=None, or attention_mask for cached decoding")
        else:
            check_cache_room(cache, t)
            token_mask = token_mask_of(input_ids, attention_mask)
            index = cache["index"]
            valid = jax.lax.dynamic_update_slice(cache["valid"], token_mask, (0, index))
            # every query in segment 1, the cache's real slots too: causal attention over the real slots
            q_seg, kv_seg = jnp.ones(token_mask.shape, jnp.int32), valid.astype(jnp.int32)
            if positions is None:
                positions = cache_positions(valid, index, t)
            layer_caches = cache["layers"]
        cos, sin = rope_cos_sin(positions, c.rotary_dim, c.rope_parameters.rope_theta)
        hidden, new_layers, router_logits, expert_ids = self.model(
            input_ids, cos, sin, token_mask, q_seg, kv_seg, segment_ids, layer_caches, index, forced_expert_ids)
        mtp_logits = mtp_hidden = mtp_router_logits = None
        if with_mtp or (self.is_initializing() and c.mtp_num_hidden_layers):
            next_ids = jnp.concatenate([input_ids[:, 1:], jnp.zeros_like(input_ids[:, :1])], axis=1)
            mtp_hidden, mtp_router_logits = self.mtp_hidden(hidden, next_ids, positions, attention_mask, segment_ids,
                                                            detach_trunk=mtp_detach_trunk)
            if return_logits or self.is_initializing():
                mtp_logits = self.lm_head(mtp_hidden)
        logits = self.lm_head(hidden) if return_logits else None
        new_cache = None
        if cache is not None:
            new_cache = {"index": jnp.asarray(index + t, jnp.int32), "valid": valid, "layers": new_layers}
        stats = None
        if self.router_stats:
            router_logits, stats = None, router_logits
        return ModelOutput(logits, hidden, router_logits, expert_ids, new_cache, mtp_logits, mtp_router_logits, stats,
                           mtp_hidden)

    def mtp_logits(self, hidden, next_ids, positions=None, attention_mask=None, segment_ids=None):
        """MTP logits: the shared lm_head on `mtp_hidden` (arguments, errors as there).

        Returns:
            (logits [B, T, V] compute dtype, predicting token t+2, router_logits [1, B*T, E] float32).
        """
        x, router_logits = self.mtp_hidden(hidden, next_ids, positions, attention_mask, segment_ids)
        return self.lm_head(x), router_logits

    def mtp_hidden(self, hidden, next_ids, positions=None, attention_mask=None, segment_ids=None,
                   detach_trunk: bool = False):
        """The MTP block's post-norm output (uncached, full causal attention inside the MTP layer): the lm_head
        input of `mtp_logits`, and the hidden state a recursive draft feeds back in place of `hidden`.

        Args:
            hidden: [B, T, H] the main model's post-norm hidden states h_t.
            next_ids: [B, T] int32, token t+1 for each position t (the input ids shifted left by one).
            positions: [B, T] positions of h_t, or None for the default as in `__call__`.
            attention_mask: [B, T] or None (None with `segment_ids`).
            segment_ids: [B, T] int32 of packed rows, as in `__call__`: attention stays within a document,
                and next_ids[t] is replaced by the padding id 0 where token t+1 is in another segment (a
                document's last token must not see the next document's first); next_ids[T-1] is kept.
            detach_trunk: read `hidden` and the shared token embeddings under `stop_gradient` (verl's
                `detach_encoder`): the gradient of a loss on the output reaches the `mtp.*` params only.
        Returns:
            (hidden [B, T, H] compute dtype, whose lm_head logits predict token t+2, router_logits [1, B*T, E]).
        Raises:
            ValueError without an MTP block, or when `segment_ids` comes with an `attention_mask`.
        """
        c = self.config
        if not c.mtp_num_hidden_layers:
            raise ValueError("config.mtp_num_hidden_layers is 0: this model has no MTP block")
        token_mask, q_seg, kv_seg, segment_ids, positions = uncached_inputs(
            next_ids, attention_mask, segment_ids, positions)
        if segment_ids is not None:
            crosses = jnp.pad(segment_ids[:, 1:] != segment_ids[:, :-1], ((0, 0), (0, 1)))
            next_ids = jnp.where(crosses, 0, next_ids)
        cos, sin = rope_cos_sin(positions, c.rotary_dim, c.rope_parameters.rope_theta)
        next_embeds = constrain(self.model.embed_tokens(next_ids), ACTIVATION)
        if detach_trunk:
            hidden, next_embeds = jax.lax.stop_gradient(hidden), jax.lax.stop_gradient(next_embeds)
        x, router_logits = self.mtp(next_embeds, constrain(hidden, ACTIVATION), cos, sin, token_mask, q_seg, kv_seg,
                                    segment_ids is not None)
        return x, router_logits[None]


def mtp_loss(mtp_logits: jax.Array, input_ids: jax.Array, loss_mask: jax.Array | None = None,
             segment_ids: jax.Array | None = None) -> jax.Array:
    """MTP training loss: token-mean cross-entropy of the MTP head predicting token t+2 at position t.

    As in DeepSeek-V3's MTP objective (arXiv 2412.19437, eq. 24-25) with depth 1; the caller weights it.

    Args:
        mtp_logits: [B, T, V] from `ModelOutput.mtp_logits`.
        input_ids: [B, T] int32.
        loss_mask: [B, T] (1 where the token is a training target) or None (all tokens). The target of
            position t is token t+2, so the mask is read at t+2; the last two positions never count.
        segment_ids: [B, T] int32 of packed rows or None: position t counts only when token t+2 is in
            t's document (a document's last two tokens have no MTP target).
    Returns:
        scalar float32 (0 when no position counts).
    """
    b, t = input_ids.shape
    logits = mtp_logits[:, : t - 2].astype(jnp.float32)
    targets = input_ids[:, 2:]
    mask = jnp.ones((b, t - 2), jnp.float32) if loss_mask is None else loss_mask[:, 2:].astype(jnp.float32)
    if segment_ids is not None:
        mask = mask * ((segment_ids[:, 2:] == segment_ids[:, :-2]) & (segment_ids[:, :-2] > 0))
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return jnp.sum(nll * mask) / jnp.maximum(jnp.sum(mask), 1.0)
