"""Group-relative advantages for HSA-RL: GRPO, GDPO and Dr.GRPO (the HAT report, arXiv 2608.15763 (TaoLive, 2026),
"Training, three stages", stage 3: GRPO / GDPO on decomposed rewards; sources per estimator below).

Inputs are K reward components per sample (HAT: accuracy, effectiveness, tool rationality, skill
selection, CoT length penalty), weights w_k and a group id per sample (the task it was sampled for;
groups may have different sizes and need not be contiguous). Statistics over groups use an [N, N]
same-group matrix, so nothing depends on the number of groups and everything is jit-able.

- GRPO (Shao et al. 2024, arXiv 2402.03300, eq. 3; sum, then normalise):
      R = sum_k w_k r_k;   A = (R - mean_group R) / (std_group R + eps)
- GDPO (Liu et al. 2026, arXiv 2601.05242; NVlabs/GDPO; TRL `multi_objective_aggregation`):
      A_k = (r_k - mean_group r_k) / (std_group r_k + eps);   A_sum = sum_k w_k A_k;
      A = (A_sum - mean_batch A_sum) / (std_batch A_sum + eps)
  GDPO keeps reward combinations apart that GRPO's sum maps to the same advantage (the GDPO paper's
  G = 2 binary-reward example; also ms-swift PRs #7348 / #7365). With K = 1 these steps are still applied
  (NVlabs falls back to GRPO then; pick "grpo").
- Dr.GRPO (Liu et al. 2025, arXiv 2503.20783; Tunix `compute_drgrpo_advantages`):
      A = R - mean_group R   (no std division; pair with aggregation "seq-mean-token-sum-norm").

Each estimator is registered with its eps (`register_advantage_estimator`); `RLConfig.estimator` names one
and the RL step's metrics use its eps, so a new estimator is one decorated function here.

Conventions:
- std is the *sample* std (ddof = 1), as Tunix (`std(ddof=1)`), verl and NVlabs (`torch.std`) and TRL
  (`nanstd`, Bessel-corrected) compute it.
- eps is added to the std: GRPO 1e-6 (Tunix, verl), GDPO 1e-4 (NVlabs, TRL), both arguments.
- A group (or, for GDPO step 3, the batch) whose valid values are all equal, or that has fewer than 2
  valid samples (a single-completion group), gives advantage exactly 0: the normalisation is skipped,
  not evaluated (mean-subtraction in float32 can leave ~1e-9 residues that eps would not tame).
  A GDPO component constant within a group thus drops out for that group only (GDPO, arXiv 2601.05242).
- NaN (or inf) reward components: the sample is invalid. It is reported (`valid`, `num_invalid`,
  `num_invalid_per_component`), gets advantage 0 and is left out of every group and batch statistic;
  its value is never replaced by a number. This is stricter than TRL, which ignores a NaN component per
  reward (nanmean) and gives 0 only to rows where every component is NaN; here any NaN drops the sample.
  To drop it from the update completely, also multiply its action_mask by `valid` (then it adds no
  tokens to a token-mean normaliser).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp

GRPO_EPS = 1e-6
GDPO_EPS = 1e-4


class Advantages(NamedTuple):
    """Result of an advantage estimator.

    advantages: [N] float32 (0 for invalid samples).
    valid: [N] bool, False where some reward component is NaN/inf.
    num_invalid: int32 scalar, number of invalid samples.
    num_invalid_per_component: [K] int32, samples whose component k is NaN/inf.
    rewards: [N] float32 weighted sum sum_k w_k r_k before normalisation (0 for invalid samples).
    """

    advantages: jax.Array
    valid: jax.Array
    num_invalid: jax.Array
    num_invalid_per_component: jax.Array
    rewards: jax.Array


def contiguous_group_ids(n_groups: int, group_size: int) -> jax.Array:
    """[n_groups * group_size] int32 ids for the layout task-major, G completions per task."""
    return jnp.repeat(jnp.arange(n_groups, dtype=jnp.int32), group_size)


def stack_components(components, weights=None) -> tuple[jax.Array, jax.Array]:
    """Reward components and weights as arrays.

    Args:
        components: [N] (one component), [K, N], or a dict name -> [N] (order of the dict).
        weights: None (all 1), [K], or (with a dict of components) a dict with exactly the same names.
    Returns:
        (components [K, N] float32, weights [K] float32).
    """
    if isinstance(components, Mapping):
        names = list(components)
        if not names:
            raise ValueError("components: empty dict, expected at least one reward component")
        comps = jnp.stack([jnp.asarray(components[n], jnp.float32) for n in names])
        if isinstance(weights, Mapping):
            missing, extra = sorted(set(names) - set(weights)), sorted(set(weights) - set(names))
            if missing or extra:
                raise ValueError(f"weights: names must match the reward components {names}; "
                                 f"missing {missing}, unknown {extra}")
            weights = [weights[n] for n in names]
    else:
        comps = jnp.asarray(components, jnp.float32)
        if comps.ndim == 1:
            comps = comps[None]
        if comps.ndim != 2:
            raise ValueError(f"components: expected [N] or [K, N], got shape {comps.shape}")
        if isinstance(weights, Mapping):
            raise ValueError("weights: a dict of weights needs a dict of named components")
    k = comps.shape[0]
    w = jnp.ones((k,), jnp.float32) if weights is None else jnp.asarray(weights, jnp.float32).reshape(-1)
    if w.shape != (k,):
        raise ValueError(f"weights: expected {k} weights (one per component), got shape {w.shape}")
    return comps, w


def _prepare(components, group_ids, weights):
    comps, w = stack_components(components, weights)
    group_ids = jnp.asarray(group_ids)
    if group_ids.shape != comps.shape[1:]:
        raise ValueError(f"group_ids: expected shape {comps.shape[1:]} (one id per sample), got {group_ids.shape}")
    finite = jnp.isfinite(comps)
    valid = jnp.all(finite, axis=0)
    clean = jnp.where(finite & valid[None, :], comps, 0.0)
    return clean, w, group_ids, valid, finite


def _result(adv, valid, finite, rewards) -> Advantages:
    return Advantages(adv, valid, jnp.sum(~valid).astype(jnp.int32),
                      jnp.sum(~finite, axis=1).astype(jnp.int32), jnp.where(valid, rewards, 0.0))


def group_normalise(x: jax.Array, valid: jax.Array, group_ids: jax.Array, eps: float | None) -> jax.Array:
    """(x - group mean) / (group sample std + eps), or x - group mean when eps is None.

    Statistics use valid samples only. Invalid samples, groups with < 2 valid samples and groups whose
    valid values are all equal give exactly 0.

    Args:
        x: [N] float32 (any value where invalid); valid: [N] bool; group_ids: [N] int.
    Returns:
        [N] float32.
    """
    same = (group_ids[:, None] == group_ids[None, :]) & valid[None, :]      # [N, N]: j is a valid peer of i
    xv = jnp.where(valid, x, 0.0)
    n = jnp.sum(same, axis=1).astype(jnp.float32)
    mean = jnp.sum(jnp.where(same, xv[None, :], 0.0), axis=1) / jnp.maximum(n, 1.0)
    hi = jnp.max(jnp.where(same, xv[None, :], -jnp.inf), axis=1)
    lo = jnp.min(jnp.where(same, xv[None, :], jnp.inf), axis=1)
    constant = (n < 2) | (hi == lo)
    centred = xv - mean
    if eps is None:
        out = centred
    else:
        sq = jnp.where(same, (xv[None, :] - mean[:, None]) ** 2, 0.0)
        std = jnp.sqrt(jnp.sum(sq, axis=1) / jnp.maximum(n - 1.0, 1.0))
        out = centred / (std + eps)
    return jnp.where(valid & ~constant, out, 0.0)


class AdvantageEstimator(NamedTuple):
    """A registered advantage estimator.

    name: the `RLConfig.estimator` value. fn: `fn(components, group_ids, weights[, eps=]) -> Advantages`.
    eps: what its group normalisation adds to the std (passed as `eps=`), or None for an estimator that
      only centres (it takes no `eps`); the RL step's reward/*_norm metrics use the same eps.
    """

    name: str
    fn: Callable[..., Advantages]
    eps: float | None

    def __call__(self, components, group_ids, weights=None, **kwargs) -> Advantages:
        if self.eps is not None:
            kwargs.setdefault("eps", self.eps)
        return self.fn(components, group_ids, weights, **kwargs)


ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {}
_NO_EPS = object()


def register_advantage_estimator(name: str, *, eps: float | None = _NO_EPS):
    """Registers the decorated function as advantage estimator `name` with its normalisation eps.

    Args:
      name: the `RLConfig.estimator` value. eps: the eps the estimator's group normalisation adds to the std
        (float > 0), or None when it does not divide by a std; the function takes an `eps` keyword exactly
        when eps is not None.
    Raises:
      ValueError (at import, naming the estimator and the key): a name already registered, eps missing or
        not a positive number or None, a function whose `eps` keyword does not fit it.
    """

    def register(fn):
        if name in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r}: already registered")
        if eps is _NO_EPS:
            raise ValueError(f"advantage estimator {name!r}: eps missing (the std eps, or None for centring only)")
        if eps is not None and (isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0):
            raise ValueError(f"advantage estimator {name!r}: eps = {eps!r}; expected a number > 0 or None")
        takes_eps = "eps" in inspect.signature(fn).parameters
        if takes_eps != (eps is not None):
            raise ValueError(f"advantage estimator {name!r}: eps = {eps!r} but {fn.__name__} "
                             + ("takes an 'eps' keyword" if takes_eps else "takes no 'eps' keyword"))
        ADVANTAGE_ESTIMATORS[name] = AdvantageEstimator(name, fn, None if eps is None else float(eps))
        return fn

    return register


@register_advantage_estimator("grpo", eps=GRPO_EPS)
def grpo_advantages(components, group_ids, weights=None, *, eps: float = GRPO_EPS) -> Advantages:
    """GRPO: weighted sum of the components, then group normalisation (sample std + eps).

    Args:
        components: [N], [K, N] or dict name -> [N] rewards; group_ids: [N] int;
        weights: see `stack_components`; eps: added to the std (Tunix/verl 1e-6).
    """
    comps, w, gid, valid, finite = _prepare(components, group_ids, weights)
    rewards = jnp.sum(w[:, None] * comps, axis=0)
    return _result(group_normalise(rewards, valid, gid, eps), valid, finite, rewards)


@register_advantage_estimator("gdpo", eps=GDPO_EPS)
def gdpo_advantages(components, group_ids, weights=None, *, eps: float = GDPO_EPS) -> Advantages:
    """GDPO: each component normalised within its group, weighted sum, then normalised over the batch.

    Batch statistics (step 3) use all valid samples, including those of constant groups (whose A_sum
    is 0), as the reference implementations do. Every group's A_k sums to 0, so mean_batch A_sum is 0
    in exact arithmetic and a sample with A_sum == 0 (constant or single-completion group) gets exactly
    0 (its float32 value would be -mean/std ~ 1e-8).

    Args: as `grpo_advantages`; eps: added to both stds (NVlabs/TRL 1e-4).
    """
    comps, w, gid, valid, finite = _prepare(components, group_ids, weights)
    per_comp = jax.vmap(lambda c: group_normalise(c, valid, gid, eps))(comps)      # [K, N]
    a_sum = jnp.sum(w[:, None] * per_comp, axis=0)
    adv = group_normalise(a_sum, valid, jnp.zeros_like(gid), eps)
    adv = jnp.where(a_sum == 0.0, 0.0, adv)   # mean_batch A_sum is 0 in exact arithmetic: keep float residue out
    return _result(adv, valid, finite, jnp.sum(w[:, None] * comps, axis=0))


@register_advantage_estimator("dr_grpo", eps=None)
def dr_grpo_advantages(components, group_ids, weights=None) -> Advantages:
    """Dr.GRPO: weighted sum minus its group mean, no std division (removes the difficulty bias).

    Args: as `grpo_advantages` (no eps).
    """
    comps, w, gid, valid, finite = _prepare(components, group_ids, weights)
    rewards = jnp.sum(w[:, None] * comps, axis=0)
    return _result(group_normalise(rewards, valid, gid, None), valid, finite, rewards)


def get_advantage_estimator(name: str) -> AdvantageEstimator:
    """The estimator registered as `name`; ValueError listing `ADVANTAGE_ESTIMATORS` if unknown."""
    if name not in ADVANTAGE_ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {name!r}; valid: {', '.join(ADVANTAGE_ESTIMATORS)}")
    return ADVANTAGE_ESTIMATORS[name]


def compute_advantages(name: str, components, group_ids, weights=None, **kwargs) -> Advantages:
    """Estimator `name` on (components [K, N] / [N] / {name: [N]}, group_ids [N], weights) with its
    registered eps (a keyword `eps` in `kwargs` overrides it); ValueError for an unknown name."""
    return get_advantage_estimator(name)(components, group_ids, weights, **kwargs)
