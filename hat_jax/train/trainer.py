"""The training loop every stage shares: `TrainState`, a jitted accumulating `train_step`, `run_stage`.

A stage supplies one loss function over a micro-batch,

    loss_fn(params, micro_batch, rng) -> (loss_sum, n_tokens, aux)

where `loss_sum` is the *sum* of the per-token (or per-sequence) losses of the micro-batch, `n_tokens` the
count it is normalised by (independent of params) and `aux` a dict of scalars; `aux["lb_loss"]`, when
present, is the micro-batch's MoE load-balancing loss (`moe_aux`, from the forward's per-layer router sums
`output_router_stats`: the stages' models take them inside each layer, `router_stats=True`), and
`aux["mtp_loss"]`, when present, its MTP loss (`hat_jax.train.mtp`), weighted the same way with mtp_coef.

Gradient accumulation: a step's batch has leading dims [accum, micro, ...]; a
`jax.lax.scan` over the accum micro-batches sums the gradients of

    loss_sum_i + lb_coef * n_i * lb_i

and divides once by N = sum_i n_i, so the objective is

    L = (sum_i loss_sum_i) / N  +  lb_coef * (sum_i n_i lb_i) / N  [+  mtp_coef * (sum_i n_i mtp_i) / N],

i.e. the token mean over the *whole* batch (not a mean of per-micro-batch means) plus the
load-balancing loss of each micro-batch weighted by its share of the loss tokens (equal to the plain
mean over micro-batches when they hold equal token counts; with accum = 1 it is the batch's lb loss,
as in transformers' `Qwen3_5MoeForCausalLM.forward`: loss + router_aux_loss_coef * aux_loss).
With lb_coef = 0 the accumulated gradient equals the full-batch gradient (tested at 1e-6, fp32).
Then global-norm clipping and AdamW (`hat_jax.train.optim`). `train_step` is jitted with the state's
buffers donated.

Precision: params stay in their dtype (fp32 by default); a stage asking for bf16 compute builds its model
with `dtype=bfloat16`, so activations are bf16 and gradients/optimizer state fp32.

Sharding: with `mesh` given (`hat_jax.model.sharding.default_mesh()` when `jax.device_count() > 1`: fsdp x
expert), params and the optimizer moments are placed by `hat_jax.model.sharding` rules, step/rng replicated,
and batches split over ('data', 'fsdp') on their micro-batch axis; GSPMD inserts the collectives.

`run_stage`: the loop (metrics, checkpoints, and a non-finite step refused before anything of it is saved).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from tqdm.auto import tqdm

from hat_jax.model.process_sync import start_together
from hat_jax.model.router_stats import RouterStats, expert_load_cv, load_balancing_loss_from_stats, router_stats
from hat_jax.model.params import params_logical_axes, tied_lm_head
from hat_jax.model.sharding import fitted_spec, logical_to_mesh, spec_for

log = logging.getLogger(__name__)

LossFn = Callable[[Any, Mapping[str, jax.Array], jax.Array], tuple[jax.Array, jax.Array, dict]]


@flax.struct.dataclass
class TrainState:
    """params: model pytree; opt_state: optax state; step: int32 scalar (updates applied); rng: typed key."""

    params: Any
    opt_state: Any
    step: jax.Array
    rng: jax.Array


FINITE_CHECKED = ("loss", "total_loss", "grad_norm", "lr")  # host-side names, in the order they are reported


class NonFiniteLossError(FloatingPointError):
    """A step's loss, gradient norm, learning rate or updated parameters were NaN/inf; the stage stopped before
    saving anything of that step. `quantity` names the first non-finite one ("updated parameters" when only the
    parameters were)."""

    def __init__(self, step: int, metrics: Mapping[str, float], last_checkpoint: int | None, where: str = ""):
        self.step, self.metrics, self.last_checkpoint = step, dict(metrics), last_checkpoint
        self.quantity = next((k for k in FINITE_CHECKED if k in metrics and not math.isfinite(metrics[k])),
                             "updated parameters")
        kept = (f"the last checkpoint that passed this check is step {last_checkpoint}" if last_checkpoint is not None
                else "no checkpoint was written")
        shown = ", ".join(f"{k}={metrics[k]:.6g}" for k in (*FINITE_CHECKED, "lb_loss") if k in metrics)
        super().__init__(f"non-finite {self.quantity} at step {step} ({shown}); stopped without saving step {step}, "
                         f"{kept}{where}. Lower the learning rate (optim.lr) or check the data, then rerun")


def finite_flag(metrics: Mapping[str, jax.Array], params) -> jax.Array:
    """float32 scalar, 1.0 iff loss, total_loss, grad_norm (those present) and every leaf of `params` are finite.

    One fused reduction inside the jitted step, returned among the metrics (no extra device-to-host sync).
    """
    checks = [jnp.all(jnp.isfinite(metrics[k])) for k in ("loss", "total_loss", "grad_norm") if k in metrics]
    checks += [jnp.all(jnp.isfinite(leaf)) for leaf in jax.tree_util.tree_leaves(params)
               if jnp.issubdtype(leaf.dtype, jnp.inexact)]
    return jnp.all(jnp.stack(checks)).astype(jnp.float32)


def check_finite(step: int, metrics: dict[str, float], checkpointer) -> None:
    """Pops `metrics["finite"]` (`finite_flag`) and raises `NonFiniteLossError` for step `step` when it is 0 or a
    checked metric (`FINITE_CHECKED`) is NaN/inf; `checkpointer` (or None) gives the last step saved."""
    flag = metrics.pop("finite", 1.0)
    if flag == 1.0 and all(math.isfinite(metrics[k]) for k in FINITE_CHECKED if k in metrics):
        return
    last = checkpointer.latest_step() if checkpointer is not None else None
    raise NonFiniteLossError(step, metrics, last)


def init_train_state(params, optimizer: optax.GradientTransformation, rng: jax.Array) -> TrainState:
    """A fresh state at step 0 (rng: a typed key, e.g. `jax.random.key(seed)`)."""
    return TrainState(params, optimizer.init(params), jnp.zeros((), jnp.int32), rng)


def place_state(state: TrainState, shardings: TrainState | None = None) -> TrainState:
    """`state` committed to devices: placed by `shardings` (a mesh run), else on the first device.

    Every stage calls this on a fresh or restored state before its first step. A train step's outputs
    are committed arrays; uncommitted inputs (a fresh optimizer count, a restored step or rng) would give
    the jitted step a different cache key at step 1 than at step 2, compiling it twice.
    """
    return jax.device_put(state, shardings if shardings is not None else jax.devices()[0])


def output_router_stats(out, token_mask: jax.Array | None, top_k: int) -> RouterStats:
    """The per-layer router sums of one forward (`hat_jax.model.router_stats`), padding excluded.

    Args:
        out: a `ModelOutput`: its `router_stats` (a model built with `router_stats=True`, which took them over
            the call's token mask inside each layer) or, when None, its `router_logits` [L, B*T, E].
        token_mask: [B, T] (1 = real token) or None: the mask the model was called with (attention_mask, or
            segment_ids > 0); applied to router_logits only. top_k: experts per token.
    Returns:
        RouterStats with leading dim L.
    """
    if out.router_stats is not None:
        return out.router_stats
    return router_stats(out.router_logits, top_k, None if token_mask is None else token_mask.reshape(-1))


def moe_aux(stats: RouterStats) -> dict[str, jax.Array]:
    """MoE auxiliaries of one forward from its router sums (`output_router_stats`).

    Returns:
        {"lb_loss": `load_balancing_loss_from_stats` (float32 scalar; equals
        `hat_jax.model.moe.load_balancing_loss` of the logits), "moe/expert_load_cv": `expert_load_cv`
        (std / mean over experts of the top-k counts pooled over layers, 0 = balanced; no gradient)}.
    """
    return {"lb_loss": load_balancing_loss_from_stats(stats), "moe/expert_load_cv": expert_load_cv(stats)}


def accumulate_gradients(loss_fn: LossFn, params, batch: Mapping[str, jax.Array], rng: jax.Array,
                         lb_coef: float = 0.0, mtp_coef: float = 0.0) -> tuple[Any, dict[str, jax.Array]]:
    """Gradient of the batch objective L (module docstring), accumulated over micro-batches with a scan.

    Args:
        loss_fn: the stage's micro-batch loss. params: the model pytree.
        batch: leaves [accum, micro, ...]. rng: a typed key, split into one key per micro-batch.
        lb_coef: coefficient of aux["lb_loss"]. mtp_coef: coefficient of aux["mtp_loss"] (when reported).
    Returns:
        (grads like params, stats): stats = {loss: sum loss_sum / N, lb_loss: sum n_i lb_i / N,
        total_loss: L, loss_tokens: N, mtp_loss: sum n_i mtp_i / N (when reported), and each other aux
        key averaged over the micro-batches}; N is floored at 1 for the division (a batch without loss
        tokens gives zero CE gradient).
    """
    def micro_grads(micro, r):
        def objective(p):
            loss_sum, n, aux = loss_fn(p, micro, r)
            n = jax.lax.stop_gradient(jnp.asarray(n, jnp.float32))
            lb = aux.get("lb_loss", jnp.zeros((), jnp.float32))
            total = loss_sum + lb_coef * n * lb
            if "mtp_loss" in aux:
                total = total + mtp_coef * n * aux["mtp_loss"]
            return total, (loss_sum, n, lb, aux)

        return jax.grad(objective, has_aux=True)(params)

    accum = jax.tree_util.tree_leaves(batch)[0].shape[0]
    rngs = jax.random.split(rng, accum)

    def body(g_acc, xs):
        g, (loss_sum, n, lb, aux) = micro_grads(*xs)
        return jax.tree_util.tree_map(jnp.add, g_acc, g), (loss_sum, n, lb, aux)

    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    grads, (loss_sums, ns, lbs, auxs) = jax.lax.scan(body, zeros, (batch, rngs))  # per-micro-batch stats stacked
    loss_sum, n, lb_sum = jnp.sum(loss_sums), jnp.sum(ns), jnp.sum(ns * lbs)
    aux_sum = {k: jnp.sum(v.astype(jnp.float32)) for k, v in auxs.items()}
    denom = jnp.maximum(n, 1.0)
    grads = jax.tree_util.tree_map(lambda g: g / denom, grads)
    stats = {k: v / accum for k, v in aux_sum.items() if k not in ("lb_loss", "mtp_loss")}
    total = loss_sum + lb_coef * lb_sum
    if "mtp_loss" in auxs:
        mtp_sum = jnp.sum(ns * auxs["mtp_loss"])
        stats["mtp_loss"] = mtp_sum / denom
        total = total + mtp_coef * mtp_sum
    stats.update(loss=loss_sum / denom, lb_loss=lb_sum / denom, total_loss=total / denom, loss_tokens=n)
    return grads, stats


def make_train_step(loss_fn: LossFn, optimizer: optax.GradientTransformation, *, lb_coef: float = 0.0,
                    mtp_coef: float = 0.0, schedule: optax.Schedule | None = None, shardings: TrainState | None = None,
                    donate: bool = True, tie_lm_head: bool = False
                    ) -> Callable[[TrainState, Mapping[str, jax.Array]], tuple[TrainState, dict]]:
    """The jitted `train_step(state, batch) -> (state, metrics)`.

    Args:
        loss_fn: the stage's micro-batch loss (module docstring).
        optimizer: e.g. `hat_jax.train.optim.make_optimizer`.
        lb_coef: coefficient of `aux["lb_loss"]` (ignored when loss_fn reports none).
        mtp_coef: coefficient of `aux["mtp_loss"]` (ignored when loss_fn reports none).
        schedule: step -> lr, only to report `lr` in the metrics (omitted when None).
        shardings: `state_shardings(...)` to keep the new state on (multi-device), or None.
        donate: donate the input state's buffers (the caller must not reuse `state`).
        tie_lm_head: train the lm_head as the embedding's transpose (`hat_jax.model.params.tied_lm_head`): the loss
            sees the tied params, so the embedding gets both gradients and the lm_head none, and the new params
            are tied again after the update (the state's lm_head always equals the embedding's transpose).
    Returns:
        train_step; `batch` leaves have leading dims [accum, micro, ...] (`split_micro_batches`). Metrics
        (float32 scalars): those of `accumulate_gradients`, grad_norm (before clipping), finite (`finite_flag`
        of the updated params) and lr.
    """

    tie = tied_lm_head if tie_lm_head else (lambda p: p)
    objective = (lambda p, *args: loss_fn(tie(p), *args)) if tie_lm_head else loss_fn

    def step(state: TrainState, batch: Mapping[str, jax.Array]):
        rng, step_rng = jax.random.split(state.rng)
        grads, metrics = accumulate_gradients(objective, state.params, batch, step_rng, lb_coef, mtp_coef)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        new = TrainState(tie(optax.apply_updates(state.params, updates)), opt_state, state.step + 1, rng)
        if shardings is not None:
            new = jax.lax.with_sharding_constraint(new, shardings)
        metrics["grad_norm"] = optax.tree.norm(grads)
        metrics["finite"] = finite_flag(metrics, new.params)
        if schedule is not None:
            metrics["lr"] = jnp.asarray(schedule(state.step), jnp.float32)
        return new, metrics

    return start_together(jax.jit(step, donate_argnums=(0,) if donate else ()), "train_step")


def split_micro_batches(batch: Mapping[str, np.ndarray], accum_steps: int, keys=None) -> dict[str, np.ndarray]:
    """[B, ...] host arrays -> [accum, B // accum, ...] (row i of micro-batch a is row a * micro + i).

    Raises:
        ValueError: B not divisible by accum_steps.
    """
    out = {}
    for k, v in batch.items():
        if keys is not None and k not in keys:
            continue
        v = np.asarray(v)
        if v.shape[0] % accum_steps:
            raise ValueError(f"batch[{k!r}] has {v.shape[0]} rows, not divisible by accum_steps={accum_steps}")
        out[k] = v.reshape((accum_steps, v.shape[0] // accum_steps) + v.shape[1:])
    return out


# ---------------------------------------------------------------------------------------------- sharding

def state_shardings(state: TrainState, optimizer: optax.GradientTransformation, model_config, mesh: Mesh) -> TrainState:
    """NamedShardings for a TrainState (or its abstract shapes): params by the logical-axis rules, optimizer
    moments like their params, counters/step/rng replicated."""
    param_sh = logical_to_mesh(params_logical_axes(model_config), state.params, mesh)
    replicated = NamedSharding(mesh, PartitionSpec())
    opt_sh = optax.tree_map_params(optimizer, lambda _, s: s, state.opt_state, param_sh,
                                   transform_non_params=lambda _: replicated)
    return TrainState(param_sh, opt_sh, replicated, replicated)


def batch_ways(mesh: Mesh | None) -> int:
    """How many ways `micro_batch_sharding` can split a micro-batch's rows: the product of the mesh's batch axes
    (1 without a mesh)."""
    if mesh is None:
        return 1
    entry = spec_for(("batch",))[0]
    axes = (entry,) if isinstance(entry, str) else tuple(entry or ())
    return int(np.prod([dict(mesh.shape).get(a, 1) for a in axes]))


def micro_batch_sharding(mesh: Mesh, ndim: int, rows: int | None = None) -> NamedSharding:
    """[accum, micro, ...]: micro-batch axis over the mesh's batch axes ('data', 'fsdp', 'expert'), the rest
    replicated; with `rows` (the micro-batch size) over the longest prefix of them that divides it."""
    logical = ("batch",) + (None,) * (ndim - 2)
    spec = spec_for(logical) if rows is None else fitted_spec((rows,) + (1,) * (ndim - 2), logical, dict(mesh.shape))
    return NamedSharding(mesh, PartitionSpec(None, *spec))


def place_batch(batch: Mapping[str, np.ndarray], mesh: Mesh | None, *,
                global_rows: int | None = None) -> dict[str, jax.Array]:
    """Host batch [accum, micro, ...] -> device arrays (the micro-batch axis sharded over the mesh's batch
    axes that divide it, when a mesh is given).

    With several processes each contributes its rows (`jax.make_array_from_process_local_data`): a host batch
    of the whole micro-batch (global_rows None) gives this process's rows of it (`process_rows`); with
    `global_rows` (the global micro-batch size) the host batch already holds only those rows, in order.

    Raises:
      ValueError: several processes without a mesh; a host batch whose rows are not this process's count.
    """
    if mesh is None:
        if jax.process_count() > 1:
            raise ValueError("place_batch: several processes need a mesh over their devices")
        return {k: jnp.asarray(v) for k, v in batch.items()}
    if jax.process_count() == 1:
        return {k: jax.device_put(v, micro_batch_sharding(mesh, np.ndim(v), np.shape(v)[1])) for k, v in batch.items()}
    out = {}
    for k, v in batch.items():
        v = np.asarray(v)
        accum, micro = v.shape[0], global_rows or v.shape[1]
        rows = process_rows(mesh, accum, micro)
        local = rows[rows < micro]  # the within-micro-batch offsets of this process (same for every micro-batch)
        if global_rows is None:
            v = v[:, local]
        elif v.shape[1] != local.size:
            raise ValueError(f"batch[{k!r}] holds {v.shape[1]} rows per micro-batch; process {jax.process_index()} "
                             f"holds {local.size} of {micro}")
        sharding = micro_batch_sharding(mesh, v.ndim, micro)
        out[k] = jax.make_array_from_process_local_data(sharding, v, (accum, micro) + v.shape[2:])
    return out


def process_rows(mesh: Mesh, accum: int, micro: int) -> np.ndarray:
    """The rows of a global batch of accum x micro rows (row a * micro + r is row r of micro-batch a, as
    `split_micro_batches` cuts them) that this process's devices hold under `micro_batch_sharding`: sorted
    int64 indices, the same offsets r in every micro-batch (all rows in a single-process run; rows shared by
    several processes when the batch axes that divide `micro` do not span every process).

    Raises:
      ValueError: accum or micro < 1.
    """
    if accum < 1 or micro < 1:
        raise ValueError(f"process_rows: accum ({accum}) and micro ({micro}) must be >= 1")
    sharding = micro_batch_sharding(mesh, 2, micro)
    offsets = set()
    for index in sharding.addressable_devices_indices_map((accum, micro)).values():
        offsets.update(range(micro)[index[1]])
    r = np.asarray(sorted(offsets), np.int64)
    return (np.arange(accum, dtype=np.int64)[:, None] * micro + r[None, :]).reshape(-1)


# ---------------------------------------------------------------------------------------------- the loop

@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """steps: final step number; log_every / ckpt_every: intervals in steps (a checkpoint is also written at
    the end); desc: progress-bar label; progress: show the bar; shown: metric keys the bar and the log line show
    beside the loss (RL: the reward and the calls per episode), each by its name after the last "/" (distinct,
    and neither "loss" nor "tok_s", which the bar shows already)."""

    steps: int
    log_every: int = 10
    ckpt_every: int = 100
    desc: str = "train"
    progress: bool = True
    shown: tuple[str, ...] = ()

    def __post_init__(self):
        if self.steps < 0 or self.log_every < 1 or self.ckpt_every < 1:
            raise ValueError(f"LoopConfig: steps ({self.steps}) >= 0, log_every ({self.log_every}) and ckpt_every "
                             f"({self.ckpt_every}) >= 1 required")
        names = [k.rsplit("/", 1)[-1] for k in self.shown]
        clash = sorted({n for n in names if names.count(n) > 1 or n in ("loss", "tok_s")})
        if clash:
            raise ValueError(f"LoopConfig.shown = {self.shown!r}: the names after the last '/' must be distinct and "
                             f"not 'loss' or 'tok_s'; clashing: {clash}")


def shown_values(keys: Sequence[str], values: Mapping[str, float]) -> dict[str, str]:
    """{name after the last "/": value with 2 decimals} for the `keys` that `values` holds, in order
    (`LoopConfig.shown`); an undefined (NaN) value reads "n/a"."""
    return {k.rsplit("/", 1)[-1]: "n/a" if math.isnan(values[k]) else f"{values[k]:.2f}" for k in keys if k in values}


def real_tokens(batch: Mapping[str, Any]) -> int:
    """Non-padding tokens of a host batch: non-zero segment_ids (packed rows), else the attention_mask's sum,
    else every input id."""
    if "segment_ids" in batch:  # packed rows: segment id 0 is padding
        return int(np.count_nonzero(batch["segment_ids"]))
    if "attention_mask" in batch:
        return int(np.sum(batch["attention_mask"]))
    return int(np.size(batch["input_ids"])) if "input_ids" in batch else 0


def _next_batch(batches: Iterator[Mapping[str, Any]] | Callable[[TrainState], Mapping[str, Any] | None],
                state: TrainState) -> Mapping[str, Any] | None:
    """The next host batch (`run_stage`'s `batches`), or None when the data has run out."""
    try:
        return batches(state) if callable(batches) else next(batches)
    except StopIteration:
        return None


# Means over the batch's loss tokens: a step without loss tokens (every row cut before its answer) reports 0 for
# them, which is no measurement, so it is left out of their log-window mean (its grad norm, lr, ... stay in).
PER_LOSS_TOKEN = ("loss", "lb_loss", "total_loss", "mtp_loss")


class _LogWindow:
    """The metrics of the steps since the last log line, and the token rate over them. The first step of a
    process includes compilation: its tokens and time are not in the rate. The `PER_LOSS_TOKEN` means skip
    steps with no loss tokens; a window holding only such steps reports none of them. A NaN value is a metric
    undefined at that step (RL's name validity in a step without tool calls; a non-finite loss stops the run
    before it gets here): the window's mean leaves it out, and is NaN only when every step's value is."""

    def __init__(self, start: int):
        self.start, self.began = start, time.perf_counter()
        self.values: dict[str, list[float]] = {}
        self.tokens, self.t0, self.first_done, self.rate = 0, None, None, None

    def add(self, metrics: Mapping[str, float], n_tok: int, now: float) -> None:
        """Records one step's metrics and tokens, finished at `now`."""
        if self.t0 is None:
            self.t0 = self.first_done = now
        else:
            self.tokens += n_tok
        empty = metrics.get("loss_tokens", 1) == 0
        for k, v in metrics.items():
            if not (empty and k in PER_LOSS_TOKEN):
                self.values.setdefault(k, [])
                if not math.isnan(v):
                    self.values[k].append(v)

    def emit(self, loop: LoopConfig, step: int, now: float, writer) -> None:
        """Writes the window's means (and tokens_per_s) to `writer`, logs a line when there is no progress bar,
        and starts a new window."""
        values = {k: float(np.mean(v)) if v else math.nan for k, v in self.values.items()}
        if self.tokens and now > self.t0:
            values["tokens_per_s"] = self.rate = self.tokens / (now - self.t0)
        if writer is not None:
            writer.scalars(step, {(k if "/" in k else f"train/{k}"): v for k, v in values.items()})
        if not loop.progress:  # no bar: one log line per log window with the rate and the ETA
            done = step - self.start
            per_step = (now - self.first_done) / (done - 1) if done > 1 else now - self.began
            loss = f"loss {values['loss']:.4f}" if "loss" in values else "no loss tokens in these steps"
            loss += "".join(f", {name} {value}" for name, value in shown_values(loop.shown, values).items())
            log.info("%s step %d/%d %s, %.2f s/step, ETA %.0f s", loop.desc, step, loop.steps, loss, per_step,
                     per_step * (loop.steps - step))
        self.values, self.tokens, self.t0 = {}, 0, now


def run_stage(loop: LoopConfig, state: TrainState,
              batches: Iterator[Mapping[str, Any]] | Callable[[TrainState], Mapping[str, Any] | None],
              step_fn: Callable[[TrainState, Mapping[str, jax.Array]], tuple[TrainState, dict]], *,
              prepare: Callable[[Mapping[str, Any]], Mapping[str, jax.Array]] = lambda b: b,
              count_tokens: Callable[[Mapping[str, Any]], int] | None = None,
              checkpointer=None, data_state: Callable[[], Any] = lambda: None,
              writer=None, batch_metrics: Callable[[Mapping[str, Any]], dict] | None = None) -> TrainState:
    """Runs `step_fn` from `state.step` to `loop.steps`, with a tqdm progress bar (rate, ETA), metrics every
    `log_every` steps, a checkpoint every `ckpt_every` steps and at the end.

    Every step's metrics carry `finite` (`finite_flag`: one fused reduction in the jitted step over the loss,
    total loss, gradient norm and the updated parameters), read with the metrics the loop fetches anyway; a
    step whose flag is 0 (or whose lr is not finite) raises `NonFiniteLossError` naming the step and the
    quantity before anything of that step is saved, so every checkpoint on disk passed the check.

    Args:
        batches: host batches (one per step); exhausting it ends the stage early (a checkpoint is written).
            On-policy stages (OPD, RL) pass a callable instead: state -> the next host batch, built from the
            current params (rollouts), or None to end the stage early.
        prepare: host batch -> device batch for `step_fn` (split into micro-batches, placed/sharded).
        count_tokens: host batch -> tokens processed (for train/tokens_per_s); default: non-zero segment_ids
            (packed rows), else attention_mask sum, else input_ids size, else 0 (no rate reported).
        checkpointer: a `hat_jax.train.checkpoints.StageCheckpointer` (or None: nothing saved).
        data_state: () -> the data iterator's state after the batches consumed so far (saved with the state).
        writer: a `hat_jax.train.metrics.MetricsWriter` (or None); metric k goes to tag "train/k" unless k
            already has a "family/" prefix.
        batch_metrics: host batch -> extra scalars (e.g. data/hsa_share), averaged like the others.
    Returns:
        the final state (after waiting for the last checkpoint).
    Raises:
        NonFiniteLossError: a step's loss, total_loss, grad_norm, lr or updated parameters are NaN/inf
            (`check_finite`; nothing of that step is saved).
    """
    count_tokens = count_tokens or real_tokens
    start = int(jax.device_get(state.step))
    bar = tqdm(total=loop.steps, initial=start, desc=loop.desc, unit="step", disable=not loop.progress,
               dynamic_ncols=True)
    window = _LogWindow(start)
    last_saved = None
    try:
        for step in range(start + 1, loop.steps + 1):
            host = _next_batch(batches, state)
            if host is None:
                bar.write(f"{loop.desc}: data exhausted after step {step - 1}")
                break
            extra = batch_metrics(host) if batch_metrics else {}
            n_tok = count_tokens(host)
            state, metrics = step_fn(state, prepare(host))
            metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
            check_finite(step, metrics, checkpointer)
            now = time.perf_counter()
            window.add({**metrics, **extra}, n_tok, now)
            if step % loop.log_every == 0 or step == loop.steps:
                window.emit(loop, step, now, writer)
            rate = window.rate
            bar.set_postfix(loss=f"{metrics['loss']:.4f}", **shown_values(loop.shown, {**metrics, **extra}),
                            **({"tok_s": f"{rate:.0f}"} if rate else {}), refresh=False)
            bar.update(1)
            if checkpointer is not None and (step % loop.ckpt_every == 0 or step == loop.steps):
                checkpointer.save(step, state, data_state())
                last_saved = step
                if writer is not None:  # a killed run keeps every point up to its last checkpoint
                    writer.flush()
        final = int(jax.device_get(state.step))
        if checkpointer is not None and final != last_saved and final > start:
            checkpointer.save(final, state, data_state())
    finally:
        bar.close()
        if checkpointer is not None:
            checkpointer.wait()
        if writer is not None:
            writer.flush()
    return state
