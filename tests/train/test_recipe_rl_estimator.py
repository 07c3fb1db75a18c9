"""Recipe "add an RL estimator": a toy advantage estimator registered here with its eps is accepted by
`RLConfig` and used, with that eps, by the RL step's advantage computation and metrics
(hat_jax.train.advantages, hat_jax.train.rl_rewards.host_batch)."""

import math
import types

import numpy as np
import pytest

from hat_jax.judges.rewards import COMPONENTS
from hat_jax.train import advantages as A
from hat_jax.train.rl import RLConfig
from hat_jax.train.rl_rewards import host_batch

NAME = "wide_eps_grpo"
EPS = 0.5
ROOT2 = math.sqrt(2.0)


@pytest.fixture
def toy_estimator():
    """Registers the toy estimator for one test and removes it afterwards (the registry is process-wide)."""

    @A.register_advantage_estimator(NAME, eps=EPS)
    def wide_eps_grpo(components, group_ids, weights=None, *, eps):
        """GRPO's group normalisation with the registered (large) eps."""
        return A.grpo_advantages(components, group_ids, weights, eps=eps)

    try:
        yield A.ADVANTAGE_ESTIMATORS[NAME]
    finally:
        del A.ADVANTAGE_ESTIMATORS[NAME]


def rollout(n: int = 4, t: int = 8) -> types.SimpleNamespace:
    """A hand-made rollout of two tasks x two episodes (the fields `host_batch` reads)."""
    mask = np.zeros((n, t), np.int32)
    mask[:, 2:5] = 1
    stats = {"tokens_generated": 12, "tokens_per_s": 3.0, "mean_turns": 1.0, "truncated": 0, "seq_lens": [5] * n,
             "outcomes": {"replied": n}}
    return types.SimpleNamespace(input_ids=np.ones((n, t), np.int32), attention_mask=np.ones((n, t), np.int32),
                                 action_mask=mask, old_logprobs=np.zeros((n, t), np.float32), expert_ids=None,
                                 group_ids=np.array([0, 0, 1, 1], np.int32), stats=stats)


def components() -> dict[str, np.ndarray]:
    """Accuracy 1, 0 in task 0 and 1, 1 in task 1; every other component 0: the total is [1, 0, 1, 1]."""
    comps = {k: np.zeros(4, np.float32) for k in COMPONENTS}
    comps["accuracy"] = np.array([1.0, 0.0, 1.0, 1.0], np.float32)
    return comps


def test_the_toy_estimator_is_registered_with_its_eps(toy_estimator):
    assert (toy_estimator.name, toy_estimator.eps) == (NAME, EPS)
    assert A.get_advantage_estimator(NAME) is toy_estimator
    assert RLConfig(estimator=NAME).estimator == NAME


def test_an_rl_step_with_the_toy_estimator_uses_its_eps(toy_estimator):
    # task 0: {1, 0}, mean 0.5, sample std 1/sqrt(2): A = +-0.5 / (1/sqrt(2) + 0.5) = +-(sqrt(2) - 1); task 1 is
    # constant: 0. GRPO's eps 1e-6 gives +-0.5 * sqrt(2) instead.
    batch, metrics = host_batch(rollout(), components(), [[0]] * 4, RLConfig(estimator=NAME, train_bucket=8))
    np.testing.assert_allclose(batch["advantages"], [ROOT2 - 1, 1 - ROOT2, 0.0, 0.0], rtol=1e-6)
    # the metrics normalise with the same eps: std of [a, -a, 0, 0] is a / sqrt(2)
    assert metrics["reward/total_norm"] == pytest.approx((ROOT2 - 1) / ROOT2, rel=1e-6)
    assert metrics["reward/accuracy_norm"] == pytest.approx((ROOT2 - 1) / ROOT2, rel=1e-6)
    assert metrics["adv/zero_frac"] == 0.5 and metrics["reward/total"] == 0.75
    np.testing.assert_array_equal(batch["action_mask"], rollout().action_mask)
    grpo, grpo_metrics = host_batch(rollout(), components(), [[0]] * 4, RLConfig(estimator="grpo", train_bucket=8))
    np.testing.assert_allclose(grpo["advantages"], [1 / ROOT2, -1 / ROOT2, 0.0, 0.0], rtol=1e-5)
    assert grpo_metrics["reward/total_norm"] == pytest.approx(0.5, rel=1e-5)


def test_compute_advantages_by_name_passes_the_registered_eps(toy_estimator):
    out = A.compute_advantages(NAME, [1.0, 0.0, 1.0, 1.0], [0, 0, 1, 1])
    np.testing.assert_allclose(out.advantages, [ROOT2 - 1, 1 - ROOT2, 0.0, 0.0], rtol=1e-6)
    wider = A.compute_advantages(NAME, [1.0, 0.0, 1.0, 1.0], [0, 0, 1, 1], eps=1.0)  # an explicit eps wins
    np.testing.assert_allclose(wider.advantages[:2], [0.5 / (1 / ROOT2 + 1), -0.5 / (1 / ROOT2 + 1)], rtol=1e-6)


def test_without_the_registration_the_name_is_refused():
    with pytest.raises(ValueError, match=f"unknown advantage estimator '{NAME}'; valid: grpo, gdpo, dr_grpo"):
        RLConfig(estimator=NAME)
