"""GRPO / GDPO / Dr.GRPO advantages on hand-computed groups, incl. degenerate groups and NaN rewards."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hat_jax.train.advantages import (ADVANTAGE_ESTIMATORS, compute_advantages, contiguous_group_ids,
                                      dr_grpo_advantages, gdpo_advantages, grpo_advantages,
                                      register_advantage_estimator)

S3 = 1 / np.sqrt(3)       # sample std (ddof=1) of {1, 0, 0}: sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3)

# group 0: three completions, rewards {1, 0, 0}; group 1: zero variance (0.1 three times: float32 mean is
# not exactly 0.1, the advantage must still be exactly 0); group 2: a single completion.
REWARDS = jnp.array([1.0, 0.0, 0.0, 0.1, 0.1, 0.1, 0.7])
GIDS = jnp.array([0, 0, 0, 1, 1, 1, 2])


def test_grpo_two_groups_zero_variance_and_single():
    out = grpo_advantages(REWARDS, GIDS)
    # group 0: (1 - 1/3)/sqrt(1/3) = 1.154701, (0 - 1/3)/sqrt(1/3) = -0.577350 (eps 1e-6 negligible)
    exp = [(2 / 3) / (S3 + 1e-6), (-1 / 3) / (S3 + 1e-6), (-1 / 3) / (S3 + 1e-6), 0, 0, 0, 0]
    np.testing.assert_allclose(out.advantages, exp, rtol=1e-5)
    assert np.all(np.asarray(out.advantages)[3:] == 0.0)            # exactly 0, not ~1e-2
    assert bool(out.valid.all()) and int(out.num_invalid) == 0


def test_dr_grpo_mean_centred_no_std():
    out = dr_grpo_advantages(REWARDS, GIDS)
    np.testing.assert_allclose(out.advantages, [2 / 3, -1 / 3, -1 / 3, 0, 0, 0, 0], rtol=1e-6)
    assert np.all(np.asarray(out.advantages)[3:] == 0.0)


def test_gdpo_single_component_group_then_batch_norm():
    out = gdpo_advantages(REWARDS, GIDS)
    # step 1 (eps 1e-4): a = [x, y, y, 0, 0, 0, 0], x = (2/3)/(S3+1e-4) ~ 1.1545, y = -x/2; mean_batch = 0;
    # batch sample std over all 7 valid = sqrt((x^2 + 2y^2)/6); without eps: x = 1.1547, std = sqrt(2/6) = 0.57735
    # -> Â ~ [2.0, -1.0, -1.0, 0, 0, 0, 0]
    x = (2 / 3) / (S3 + 1e-4)
    a = np.array([x, -x / 2, -x / 2, 0, 0, 0, 0])
    exp = (a - a.mean()) / (a.std(ddof=1) + 1e-4)
    np.testing.assert_allclose(out.advantages, exp, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.advantages[:3], [2.0, -1.0, -1.0], rtol=1e-3)


def test_gdpo_g2_example_grpo_collapses_gdpo_separates():
    # The GDPO paper's example (arXiv 2601.05242; ms-swift PR #7348): G = 2, two binary components.
    # Group 0 rollouts (0,0), (1,0): totals {0, 1}; group 1 rollouts (0,0), (1,1): totals {0, 2}.
    comps = {"accuracy": jnp.array([0.0, 1.0, 0.0, 1.0]), "effectiveness": jnp.array([0.0, 0.0, 0.0, 1.0])}
    gids = contiguous_group_ids(2, 2)
    grpo = grpo_advantages(comps, gids).advantages
    # GRPO: {0,1}: (±0.5)/0.7071 = ±0.7071; {0,2}: (±1)/1.4142 = ±0.7071 -> identical
    np.testing.assert_allclose(grpo, [-0.70711, 0.70711, -0.70711, 0.70711], atol=1e-5)
    gdpo = gdpo_advantages(comps, gids).advantages
    # GDPO before batch norm: group 0 = ±0.7071 (effectiveness constant -> drops out), group 1 = ±0.7071 ±0.7071
    # = ±1.4142; batch mean 0, sample std sqrt((0.5+0.5+2+2)/3) = 1.29099 -> ±0.5477, ±1.0954
    np.testing.assert_allclose(gdpo, [-0.54772, 0.54772, -1.09545, 1.09545], atol=2e-4)
    assert abs(float(gdpo[3])) == pytest.approx(2 * abs(float(gdpo[1])), rel=1e-3)


def test_weights_dict_and_weighted_sum():
    comps = {"accuracy": jnp.array([1.0, 0.0]), "length": jnp.array([0.0, 1.0])}
    out = dr_grpo_advantages(comps, jnp.array([0, 0]), {"length": 0.5, "accuracy": 1.0})
    # R = [1, 0.5]: mean 0.75 -> [0.25, -0.25]
    np.testing.assert_allclose(out.advantages, [0.25, -0.25], rtol=1e-6)
    np.testing.assert_allclose(out.rewards, [1.0, 0.5])
    np.testing.assert_allclose(grpo_advantages(comps, jnp.array([0, 0]), [1.0, 0.5]).advantages,
                               [0.70711, -0.70711], atol=1e-5)
    with pytest.raises(ValueError, match=r"missing \['length'\], unknown \['lenght'\]"):
        grpo_advantages(comps, jnp.array([0, 0]), {"accuracy": 1.0, "lenght": 0.5})
    with pytest.raises(ValueError, match="2 weights"):
        grpo_advantages(comps, jnp.array([0, 0]), [1.0])


def test_nan_component_drops_the_sample():
    # group 0 (4 samples): sample 2 has a NaN accuracy; the rest {1, 0, 0} normalise among themselves.
    # group 1 (2 samples): one NaN -> one valid sample left -> 0. group 2: every component NaN -> 0.
    acc = jnp.array([1.0, 0.0, jnp.nan, 0.0, 1.0, jnp.nan, jnp.nan])
    eff = jnp.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, jnp.nan])
    gids = jnp.array([0, 0, 0, 0, 1, 1, 2])
    for name in ADVANTAGE_ESTIMATORS:
        out = compute_advantages(name, {"accuracy": acc, "effectiveness": eff}, gids)
        assert np.all(np.isfinite(out.advantages)), name
        np.testing.assert_array_equal(out.valid, [True, True, False, True, True, False, False])
        assert int(out.num_invalid) == 3
        np.testing.assert_array_equal(out.num_invalid_per_component, [3, 1])
        assert np.all(np.asarray(out.advantages)[[2, 4, 5, 6]] == 0.0), name
    grpo = grpo_advantages({"accuracy": acc, "effectiveness": eff}, gids).advantages
    np.testing.assert_allclose(np.asarray(grpo)[[0, 1, 3]], [(2 / 3) / S3, (-1 / 3) / S3, (-1 / 3) / S3], rtol=1e-5)


def test_non_contiguous_group_ids_and_jit():
    rewards = jnp.array([1.0, 3.0, 0.0, 5.0])
    gids = jnp.array([7, 2, 7, 2])
    out = jax.jit(grpo_advantages)(rewards, gids)
    # group 7: {1, 0} -> ±0.7071; group 2: {3, 5} -> ∓0.7071
    np.testing.assert_allclose(out.advantages, [0.70711, -0.70711, -0.70711, 0.70711], atol=1e-5)


def test_unknown_estimator_and_bad_shapes():
    with pytest.raises(ValueError, match="grpo, gdpo, dr_grpo"):
        compute_advantages("ppo", REWARDS, GIDS)
    with pytest.raises(ValueError, match="group_ids"):
        grpo_advantages(REWARDS, GIDS[:3])


def test_registry_carries_each_estimator_and_its_eps():
    assert {n: (e.fn, e.eps) for n, e in ADVANTAGE_ESTIMATORS.items()} == {
        "grpo": (grpo_advantages, 1e-6), "gdpo": (gdpo_advantages, 1e-4), "dr_grpo": (dr_grpo_advantages, None)}


def test_an_incomplete_estimator_registration_fails_naming_the_estimator_and_the_key():
    def toy(components, group_ids, weights=None, *, eps):
        return grpo_advantages(components, group_ids, weights, eps=eps)

    def toy_centred(components, group_ids, weights=None):
        return dr_grpo_advantages(components, group_ids, weights)

    cases = [("toy", {}, toy, "advantage estimator 'toy': eps missing"),
             ("toy", {"eps": 0.0}, toy, "advantage estimator 'toy': eps = 0.0; expected a number > 0 or None"),
             ("toy", {"eps": None}, toy, "advantage estimator 'toy': eps = None but toy takes an 'eps' keyword"),
             ("toy", {"eps": 1e-3}, toy_centred, "eps = 0.001 but toy_centred takes no 'eps' keyword"),
             ("grpo", {"eps": 1e-6}, toy, "advantage estimator 'grpo': already registered")]
    for name, kwargs, fn, message in cases:
        with pytest.raises(ValueError, match=message):
            register_advantage_estimator(name, **kwargs)(fn)
    assert set(ADVANTAGE_ESTIMATORS) == {"grpo", "gdpo", "dr_grpo"}
