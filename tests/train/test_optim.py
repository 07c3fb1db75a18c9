"""The optimizer: warmup + cosine schedule values, weight-decay mask, clipping before Adam."""

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from hat_jax.train.optim import OptimConfig, decay_mask, lr_schedule, make_optimizer


def test_schedule_values_by_hand():
    # peak 1.0, warmup 4, cosine over steps 4..12 down to 0.1, constant after.
    schedule = lr_schedule(OptimConfig(lr=1.0, warmup_steps=4, total_steps=12, min_lr_ratio=0.1))
    expected = {0: 0.0, 1: 0.25, 2: 0.5, 4: 1.0,
                6: 0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * 2 / 8)),
                8: 0.55,  # half way: 0.1 + 0.9 * 0.5
                12: 0.1, 20: 0.1}
    for step, lr in expected.items():
        assert float(schedule(step)) == pytest.approx(lr, abs=1e-6), step


def test_weight_decay_mask_and_decoupled_decay():
    params = {"kernel": jnp.full((2, 3), 2.0), "norm": {"weight": jnp.full((3,), 2.0)}}
    assert decay_mask(params) == {"kernel": True, "norm": {"weight": False}}
    tx = make_optimizer(OptimConfig(lr=0.1, warmup_steps=0, total_steps=10, weight_decay=0.5, clip_norm=None))
    zero = {"kernel": jnp.zeros((2, 3)), "norm": {"weight": jnp.zeros(3)}}
    updates, _ = tx.update(zero, tx.init(params), params)
    # Zero gradient: Adam's step is 0, so only the decay moves the 2-D kernel: -lr * wd * p = -0.1.
    np.testing.assert_allclose(updates["kernel"], -0.1, atol=1e-7)
    np.testing.assert_array_equal(updates["norm"]["weight"], 0.0)


def test_clipping_happens_before_the_adam_moments():
    params = {"w": jnp.zeros(4)}
    tx = make_optimizer(OptimConfig(lr=0.1, warmup_steps=0, total_steps=10, clip_norm=1.0, b1=0.9))
    grads = {"w": jnp.asarray([3.0, 4.0, 0.0, 0.0])}  # norm 5 -> clipped to norm 1
    _, state = tx.update(grads, tx.init(params), params)
    adam = state[1][0]
    assert isinstance(adam, optax.ScaleByAdamState)
    np.testing.assert_allclose(adam.mu["w"], 0.1 * np.asarray([0.6, 0.8, 0, 0]), rtol=1e-6)
    # Same state structure with and without clipping (checkpoints stay compatible).
    unclipped = make_optimizer(OptimConfig(total_steps=10, clip_norm=None)).init(params)
    assert type(unclipped[0]) is type(state[0])


def test_bad_config_is_named():
    with pytest.raises(ValueError, match="warmup_steps"):
        OptimConfig(warmup_steps=20, total_steps=10)
    with pytest.raises(ValueError, match="min_lr_ratio"):
        OptimConfig(min_lr_ratio=2.0)


def test_total_steps_null_is_the_stage_updates():
    """total_steps None ends the schedule at the stage's updates (warmup capped there); unresolved it is refused."""
    optim = OptimConfig(lr=1.0, warmup_steps=6)
    assert optim.resolve(10) == OptimConfig(lr=1.0, warmup_steps=6, total_steps=10)
    assert optim.resolve(4) == OptimConfig(lr=1.0, warmup_steps=4, total_steps=4)      # a run shorter than the warmup
    explicit = OptimConfig(warmup_steps=2, total_steps=8)
    assert explicit.resolve(3) is explicit                                               # a set end stays
    for build in (lr_schedule, make_optimizer):
        with pytest.raises(ValueError, match=r"total_steps is None \(the stage's updates\): resolve it first"):
            build(optim)
    with pytest.raises(ValueError, match="0 updates, expected >= 1"):
        optim.resolve(0)


def test_warmup_over_the_whole_run_is_a_linear_warmup():
    """A run as short as its warmup (e.g. `--steps 5` on a preset with 5 warmup steps) has no cosine part."""
    schedule = lr_schedule(OptimConfig(lr=1.0, warmup_steps=4, total_steps=4))
    assert [float(schedule(i)) for i in range(5)] == [0.0, 0.25, 0.5, 0.75, 1.0]
