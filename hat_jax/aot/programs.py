"""Each stage's jitted programs with abstract inputs at the stage's shapes, sharded over a mesh.

A stage is one or more `Program`s: the jitted function the stage runs (the stage's own `make_train_step`,
teacher/reference forward or sampler) and `jax.ShapeDtypeStruct` arguments carrying `NamedSharding`s, so
`program.fn.lower(*program.args)` compiles without allocating anything. `resident` is the per-chip bytes
of state that lives on the chips during the program without being one of its arguments (the frozen teacher
during the student's update, the student's state during the teacher's forward).

Shapes (the stage configs of `hat_jax.experiments.scales`):
- sft: train step on [accum, batch / accum, seq_len] int32 input_ids / attention_mask / loss_mask.
- opd: the teacher forward on one micro-batch [rows / accum, seq_len] and the student's train step on
  [accum, rows / accum, seq_len] (+ old/teacher logprobs float32; "exact" adds the teacher's hidden states and
  lm_head kernel).
- rl: the train step on [minibatches x accum, rows / (minibatches x accum), seq_len] (advantages per row,
  packed expert ids [.., L, ceil(k/2), T] with routing replay, reference logprobs with beta > 0), and with beta > 0 the
  reference forward on one micro-batch. Rows are padded to seq_len (the longest an update sees).
- generate: the sampler (`hat_jax.model.sampler`) on one wave of the RL rollout batch: rl.rollout_wave_rows
  rows (all tasks_per_step x group_size rows without waves), prompts of seq_len - max_new_tokens tokens,
  max_new_tokens decoded, with the stage's moe_impl and moe_token_chunk.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from hat_jax.model.config import FULL_ATTENTION
from hat_jax.model.params import COMPUTE_DTYPES, param_counts, params_logical_axes, params_shapes
from hat_jax.model.sharding import batch_sharding, logical_to_mesh
from hat_jax.model.transformer import Qwen3_5MoeForCausalLM
from hat_jax.train.optim import lr_schedule, make_optimizer
from hat_jax.train.stage import model_options, resolved_optim
from hat_jax.train.trainer import init_train_state, micro_batch_sharding, state_shardings

STAGES = ("sft", "opd", "rl", "generate")


@dataclasses.dataclass(frozen=True)
class Program:
    """name: e.g. 'train_step'; fn: a jitted function; args: its abstract arguments (ShapeDtypeStructs with
    shardings); analytic_flops: the model FLOPs of one call, all chips together; tokens: tokens it processes;
    resident: per-chip bytes held during the call besides its arguments."""

    name: str
    fn: Callable
    args: tuple
    analytic_flops: float
    tokens: int
    resident: int = 0


def per_chip_bytes(tree) -> int:
    """Bytes of one chip's shards of a tree of sharded ShapeDtypeStructs (the largest shard per leaf)."""
    total = 0
    for leaf in jax.tree_util.tree_leaves(tree):
        shape = leaf.sharding.shard_shape(leaf.shape) if getattr(leaf, "sharding", None) is not None else leaf.shape
        total += int(np.prod(shape)) * _itemsize(leaf.dtype)
    return total


def _itemsize(dtype) -> int:
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return 8  # threefry key data: 2 x uint32
    return np.dtype(dtype).itemsize


def _abstract(tree, shardings):
    return jax.tree_util.tree_map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), tree, shardings)


def matmul_params(model_config) -> int:
    """Active parameters that multiply each token (`param_counts`'s active minus the embedding table)."""
    return param_counts(model_config)["active"] - model_config.vocab_size * model_config.hidden_size


def mtp_matmul_params(model_config) -> int:
    """Parameters that multiply each token in the MTP loss: the MTP block's active parameters
    (`param_counts`' mtp_active: fc, attention, shared expert, router, top-k routed experts) plus the shared
    lm_head its hidden states go through. 0 without an MTP block."""
    if not model_config.mtp_num_hidden_layers:
        return 0
    return param_counts(model_config)["mtp_active"] + model_config.hidden_size * model_config.vocab_size


def analytic_flops(model_config, rows: int, seq_len: int, train: bool, mtp: bool = False) -> float:
    """Model FLOPs of a forward (train=False) or forward + backward (train=True) over rows x seq_len tokens:
    (2 or 6) x `matmul_params` x tokens + (2 or 6) x full-attention layers x heads x head_dim x seq_len x
    tokens. The attention term is PaLM's (arXiv 2204.02311, appendix B: 4 x heads x head_dim x T per token and
    layer for QK^T and AV, x3 with the backward) halved for the causal mask, as MaxText's
    `calculate_tflops_training_per_device` counts it; Gated DeltaNet's chunked recurrence is not counted.
    With `mtp` (a step that trains the MTP loss) the MTP block counts as well: `mtp_matmul_params` per token
    (its layer and the lm_head pass of its logits) and its full-attention layer."""
    tokens = rows * seq_len
    attn_layers = sum(t == FULL_ATTENTION for t in model_config.layer_types)
    per_token = matmul_params(model_config)
    if mtp:
        attn_layers += model_config.mtp_num_hidden_layers
        per_token += mtp_matmul_params(model_config)
    attn = attn_layers * model_config.num_attention_heads * model_config.head_dim * seq_len * tokens
    return (6.0 if train else 2.0) * (per_token * tokens + attn)


def _state(config, model_config, mesh: Mesh):
    """(optimizer, abstract TrainState with shardings, shardings) of a stage config."""
    mu_dtype = getattr(config, "mu_dtype", None)
    optimizer = make_optimizer(resolved_optim(config), mu_dtype=COMPUTE_DTYPES[mu_dtype] if mu_dtype else None)
    param_dtype = COMPUTE_DTYPES[getattr(config, "param_dtype", "float32")]
    state = jax.eval_shape(lambda: init_train_state(params_shapes(model_config, param_dtype), optimizer,
                                                    jax.random.key(0)))
    shardings = state_shardings(state, optimizer, model_config, mesh)
    return optimizer, _abstract(state, shardings), shardings


def _frozen_params(model_config, mesh: Mesh, dtype):
    """Abstract params in `dtype`, sharded by the logical rules (a frozen teacher or reference)."""
    shapes = params_shapes(model_config, dtype)
    return _abstract(shapes, logical_to_mesh(params_logical_axes(model_config), shapes, mesh))


def _micro_batch(mesh: Mesh, split: int, rows: int, columns: dict[str, tuple[tuple[int, ...], Any]]) -> dict:
    """{key: [split, rows / split, *shape]} ShapeDtypeStructs, the micro-batch axis over the batch axes."""
    micro = rows // split
    return {k: jax.ShapeDtypeStruct((split, micro, *shape), dtype,
                                    sharding=micro_batch_sharding(mesh, 2 + len(shape)))
            for k, (shape, dtype) in columns.items()}


def _rows_batch(mesh: Mesh, rows: int, seq_len: int, dtype=jnp.int32):
    return jax.ShapeDtypeStruct((rows, seq_len), dtype, sharding=batch_sharding(mesh, 2))


def _model(config, model_config, train: bool = True) -> Qwen3_5MoeForCausalLM:
    return Qwen3_5MoeForCausalLM(model_config, dtype=COMPUTE_DTYPES[config.compute_dtype],
                                 **model_options(config, train=train))


def sft_programs(scale, model_config, mesh: Mesh, flops_check: bool = False) -> list[Program]:
    """The SFT train step (`hat_jax.train.sft`) on the preset's batch; with `flops_check` its CE and MTP loss read
    the forward's full logits instead of skipping position blocks without a target (`flops_check_assignments`)."""
    from hat_jax.train.sft import DEVICE_KEYS, sft_loss_fn
    from hat_jax.train.trainer import make_train_step

    c = scale.sft
    optimizer, state, shardings = _state(c, model_config, mesh)
    rows, t = c.data.batch_size, c.data.seq_len
    batch = _micro_batch(mesh, c.accum_steps, rows, {k: ((t,), jnp.int32) for k in DEVICE_KEYS})
    options = {**_sft_loss_options(c), **({"block_rows": None} if flops_check else {})}
    step = make_train_step(sft_loss_fn(_model(c, model_config), **options), optimizer,
                           lb_coef=c.lb_coef, mtp_coef=c.mtp_coef, schedule=lr_schedule(resolved_optim(c)),
                           shardings=shardings, tie_lm_head=c.tie_lm_head)
    return [Program("train_step", step, (state, batch), analytic_flops(model_config, rows, t, True, _trains_mtp(c)),
                    rows * t)]


def _trains_mtp(config) -> bool:
    return config.mtp_coef > 0


def _sft_loss_options(config) -> dict:
    chunk = getattr(config, "vocab_chunk", None)
    return {"mtp": _trains_mtp(config), **({} if chunk is None else {"vocab_chunk": chunk})}


def _policy_columns(t: int, packed: bool) -> dict:
    """Per-row columns of an OPD / RL update batch (name -> (shape after the row axis, dtype)); `packed`: the
    layout of `hat_jax.train.policy_packing`, compiled at the unpacked worst case's row count."""
    columns = {k: ((t,), jnp.int32) for k in ("input_ids", "segment_ids" if packed else "attention_mask",
                                               "action_mask")}
    columns["old_logprobs"] = ((t,), jnp.float32)
    if packed:
        columns.update(loss_weights=((t,), jnp.float32), loss_counts=((t,), jnp.float32))
    return columns


def opd_programs(scale, model_config, mesh: Mesh) -> list[Program]:
    """The frozen teacher's forward (one micro-batch) and the student's train step (`hat_jax.train.opd`); the
    teacher is the student's architecture (the chain's pre-SFT base) in the compute dtype."""
    from hat_jax.train.opd_loss import make_teacher_fn, opd_loss_fn
    from hat_jax.train.trainer import make_train_step

    c = scale.opd
    dtype = COMPUTE_DTYPES[c.compute_dtype]
    optimizer, state, shardings = _state(c, model_config, mesh)
    teacher = _frozen_params(model_config, mesh, dtype)
    rows, t, split = c.rows, c.seq_len, c.accum_steps
    micro = rows // split
    teacher_fn = make_teacher_fn(_model(c, model_config, train=False), c)
    columns = _policy_columns(t, c.pack_rows)
    columns["teacher_logprobs"] = ((t,), jnp.float32)
    if c.loss == "exact":
        columns["teacher_hidden"] = ((t, model_config.hidden_size), dtype)
    batch = _micro_batch(mesh, split, rows, columns)
    if c.loss == "exact":
        kernel = teacher["lm_head"]["kernel"]
        batch["teacher_kernel"] = jax.ShapeDtypeStruct((split, *kernel.shape), kernel.dtype, sharding=NamedSharding(
            mesh, PartitionSpec(None, *kernel.sharding.spec)))
    step = make_train_step(opd_loss_fn(_model(c, model_config), c), optimizer, lb_coef=c.lb_coef,
                           mtp_coef=c.mtp_coef, schedule=lr_schedule(resolved_optim(c)), shardings=shardings)
    return [
        Program("teacher_forward", teacher_fn, (teacher, _rows_batch(mesh, micro, t), _rows_batch(mesh, micro, t)),
                analytic_flops(model_config, micro, t, False), micro * t, resident=per_chip_bytes(state)),
        Program("train_step", step, (state, batch), analytic_flops(model_config, rows, t, True, _trains_mtp(c)),
                rows * t, resident=per_chip_bytes(teacher)),
    ]


def rl_programs(scale, model_config, mesh: Mesh) -> list[Program]:
    """The RL update (`hat_jax.train.rl_loss.make_rl_train_step`) and, with beta > 0, the frozen reference's
    forward on one micro-batch (in the compute dtype)."""
    from hat_jax.train.rl_loss import make_ref_logprobs, make_rl_train_step, rl_loss_fn

    c = scale.rl
    dtype = COMPUTE_DTYPES[c.compute_dtype]
    optimizer, state, shardings = _state(c, model_config, mesh)
    rows, t = c.tasks_per_step * c.group_size, c.seq_len
    split = c.ppo_minibatches * c.accum_steps
    micro = rows // split
    columns = _policy_columns(t, c.pack_rows)
    columns["advantages"] = ((t,) if c.pack_rows else (), jnp.float32)
    if c.beta > 0:
        columns["ref_logprobs"] = ((t,), jnp.float32)
    if c.routing_replay:
        columns["expert_ids"] = ((model_config.num_hidden_layers, -(-model_config.num_experts_per_tok // 2), t), jnp.int32)
    batch = _micro_batch(mesh, split, rows, columns)
    model = _model(c, model_config)
    loss_fn = rl_loss_fn(model, temperature=c.temperature, eps_low=c.eps_low, eps_high=c.eps_high, beta=c.beta,
                         aggregation=c.aggregation, max_len=c.max_len, routing_replay=c.routing_replay,
                         vocab_chunk=c.vocab_chunk, mtp=c.mtp_coef > 0, mtp_detach_trunk=c.mtp_detach_trunk)
    step = make_rl_train_step(loss_fn, optimizer, accum_steps=c.accum_steps, epochs=c.ppo_epochs,
                              minibatches=c.ppo_minibatches, lb_coef=c.lb_coef, mtp_coef=c.mtp_coef,
                              schedule=lr_schedule(resolved_optim(c)), shardings=shardings)
    updates = c.ppo_epochs
    programs = []
    reference = None
    if c.beta > 0:
        reference = _frozen_params(model_config, mesh, dtype)
        ref_fn = make_ref_logprobs(_model(c, model_config, train=False), c.temperature,
                                   c.vocab_chunk)
        programs.append(Program("reference_forward", ref_fn,
                                (reference, _rows_batch(mesh, micro, t), _rows_batch(mesh, micro, t)),
                                analytic_flops(model_config, micro, t, False), micro * t,
                                resident=per_chip_bytes(state)))
    programs.append(Program("train_step", step, (state, batch),
                            updates * analytic_flops(model_config, rows, t, True, _trains_mtp(c)), updates * rows * t,
                            resident=per_chip_bytes(reference) if reference is not None else 0))
    return programs


def generate_programs(scale, model_config, mesh: Mesh) -> list[Program]:
    """The sampler's jitted decode (`hat_jax.model.sampler`) over one wave of the RL rollout batch (module
    docstring), params in the compute dtype; the policy's optimizer state stays resident during rollouts."""
    from hat_jax.model.sampler import _decode_jit
    from hat_jax.model.sampling import SamplingConfig, _Sampling

    c = scale.rl
    dtype = COMPUTE_DTYPES[c.compute_dtype]
    rows, new = c.tasks_per_step * c.group_size, c.max_new_tokens
    rows = rows if c.rollout_wave_rows is None else min(rows, c.rollout_wave_rows)
    prompt = c.seq_len - new
    params = _frozen_params(model_config, mesh, dtype)
    _, state, _ = _state(c, model_config, mesh)
    replicated = NamedSharding(mesh, PartitionSpec())
    sampling = _Sampling.from_config(SamplingConfig(temperature=c.temperature, top_p=c.top_p, max_new_tokens=new))
    sampling = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated), sampling)
    rng = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=replicated)
    fn = jax.jit(lambda p, ids, mask, r, s: _decode_jit(p, ids, mask, r, s, config=model_config, dtype=jnp.dtype(dtype),
                                                       moe_impl=c.moe_impl, return_expert_ids=c.routing_replay,
                                                       moe_token_chunk=c.moe_token_chunk))
    args = (params, _rows_batch(mesh, rows, prompt), _rows_batch(mesh, rows, prompt, jnp.bool_), rng, sampling)
    return [Program("generate", fn, args, analytic_flops(model_config, rows, prompt + new, False),
                    rows * (prompt + new), resident=per_chip_bytes(state))]


BUILDERS: dict[str, Callable[[Any, Any, Mesh], list[Program]]] = {
    "sft": sft_programs, "opd": opd_programs, "rl": rl_programs, "generate": generate_programs}


def stage_programs(stage: str, scale, model_config, mesh: Mesh, flops_check: bool = False) -> list[Program]:
    """The programs of `stage` (one of `STAGES`); `flops_check` (sft only, with `flops_check_assignments`
    applied to `scale`) builds the FLOPs check's step.

    Raises:
        ValueError: an unknown stage (lists `STAGES`), or flops_check for a stage other than sft.
    """
    if stage not in BUILDERS:
        raise ValueError(f"unknown stage {stage!r}; valid: {', '.join(STAGES)}")
    if flops_check:
        _check_flops_check_stage(stage)
        return sft_programs(scale, model_config, mesh, flops_check=True)
    return BUILDERS[stage](scale, model_config, mesh)


FLOPS_SEQ_LEN = 4096  # the FLOPs check's default row length


def flops_check_assignments(stage: str, batch_devices: int, seq_len: int = FLOPS_SEQ_LEN) -> list[str]:
    """`--set` assignments that turn the SFT step into its FLOPs check: one row per batch device of `seq_len`
    tokens, no accumulation, no remat, full logits (the MTP loss's too: `sft_programs(flops_check=True)`), the
    'xla' attention and no MoE token chunks. The XLA cost model counts a loop body once (the vocabulary-chunk
    scan, the accumulation scan, the MoE token-chunk scan, the MTP loss's position blocks) and Pallas kernels
    only by their own estimate (splash gives none); this program has neither, so its compiled FLOPs are
    comparable with the analytic count (`analytic_flops`: 6 x active matmul params x tokens + attention, the
    MTP block's with the MTP loss), on the same mesh and partitioning as the real step.

    Raises:
        ValueError: a stage other than sft.
    """
    _check_flops_check_stage(stage)
    return [f"sft.data.batch_size={batch_devices}", f"sft.data.seq_len={seq_len}", "sft.accum_steps=1",
            "sft.remat_policy=none", "sft.vocab_chunk=null", "sft.attention_impl=xla", "sft.moe_token_chunk=null"]


def _check_flops_check_stage(stage: str) -> None:
    if stage != "sft":
        raise ValueError(f"--flops-check: the sft stage only (the other stages run the same model), got {stage!r}")


def stage_model_config(stage: str, scale, model_overrides: Sequence[tuple[str, Any]] = ()):
    """The model a stage trains: the SFT config's (preset + its model_overrides) for sft; the preset's own for
    the others (their model is the init checkpoint's); `model_overrides` on top."""
    from hat_jax.model.config import get_config

    base = scale.sft.model_config() if stage == "sft" else get_config(scale.sft.preset)
    return base.replace(**dict(model_overrides)) if model_overrides else base
