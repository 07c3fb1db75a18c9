"""Stage checkpoints: exact round trip (params, Adam state, step, RNG, Grain iterator state, config),
keep-last-N, temporary directories ignored, clear errors, and readability by `load_model_checkpoint`."""

import grain
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hat_jax.model import get_config, init_params
from hat_jax.model.checkpoint_io import load_model_checkpoint
from hat_jax.model.checkpoint_steps import DamagedCheckpointError, scan_steps
from hat_jax.train.checkpoints import (ConfigMismatchError, IncompatibleCheckpointError, StageCheckpointer,
                                       check_resumable, latest_step, restore_latest)
from hat_jax.train.optim import OptimConfig, make_optimizer
from hat_jax.train.trainer import TrainState, init_train_state

CONFIG = {"stage": "sft", "optim": {"lr": 0.001}, "steps": 10}
TX = make_optimizer(OptimConfig(lr=0.1, warmup_steps=0, total_steps=10))


def at_step(state, step):
    return state.replace(step=jnp.asarray(step, jnp.int32))


def toy_state(width=3, seed=0):
    params = {"dense": {"kernel": jnp.arange(2.0 * width).reshape(2, width)}, "norm": {"weight": jnp.ones(width)}}
    state = init_train_state(params, TX, jax.random.key(seed))
    grads = jax.tree_util.tree_map(lambda p: 0.1 * p + 0.3, params)  # one update: non-trivial Adam moments
    updates, opt_state = TX.update(grads, state.opt_state, params)
    rng, _ = jax.random.split(state.rng)
    return TrainState(jax.tree_util.tree_map(jnp.add, params, updates), opt_state, state.step + 1, rng)


def abstract(width=3):
    return jax.eval_shape(lambda: toy_state(width))


def data_iterator():
    ds = grain.MapDataset.range(40).shuffle(seed=7).map(lambda x: np.asarray([x, x * x])).batch(4)
    return iter(ds.to_iter_dataset())


def test_round_trip_is_exact_including_iterator_state_and_rng(tmp_path):
    state = toy_state()
    it = data_iterator()
    for _ in range(3):
        next(it)
    checkpointer = StageCheckpointer(tmp_path, CONFIG, get_config("micro"))
    checkpointer.save(1, state, it.get_state())
    checkpointer.close()
    expected_next = [next(it) for _ in range(2)]

    restored, data_state, config = restore_latest(tmp_path, abstract(), config=CONFIG)
    assert config == CONFIG and int(restored.step) == 1
    assert jax.tree_util.tree_structure(restored) == jax.tree_util.tree_structure(state)
    for a, b in zip(jax.tree_util.tree_leaves(restored), jax.tree_util.tree_leaves(state)):
        if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        assert a.dtype == b.dtype and np.array_equal(a, b)
    np.testing.assert_array_equal(jax.random.normal(restored.rng, (3,)), jax.random.normal(state.rng, (3,)))
    resumed = data_iterator()
    resumed.set_state(data_state)
    for want in expected_next:
        np.testing.assert_array_equal(next(resumed), want)


def test_keeps_last_n_and_ignores_temporary_directories(tmp_path):
    checkpointer = StageCheckpointer(tmp_path, CONFIG, max_to_keep=2, async_save=False)
    for step in range(1, 5):
        checkpointer.save(step, at_step(toy_state(seed=step), step), {"step": step})
    checkpointer.close()
    assert sorted(int(p.name) for p in tmp_path.iterdir() if p.name.isdigit()) == [3, 4]
    # A step that was being written when the process died: Orbax's temporary name, never read.
    (tmp_path / "5.orbax-checkpoint-tmp-1234").mkdir()
    assert latest_step(tmp_path) == 4
    _, data_state, _ = restore_latest(tmp_path, abstract())
    assert data_state == {"step": 4}
    _, data_state, _ = restore_latest(tmp_path, abstract(), step=3)
    assert data_state == {"step": 3}


def test_missing_and_incompatible_checkpoints_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        restore_latest(tmp_path / "nope", abstract())
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no complete checkpoint"):
        restore_latest(tmp_path / "empty", abstract())
    checkpointer = StageCheckpointer(tmp_path / "run", CONFIG)
    checkpointer.save(4, at_step(toy_state(), 4), None)
    checkpointer.close()
    where = str((tmp_path / "run" / "4").resolve())
    with pytest.raises(IncompatibleCheckpointError, match=rf"{where}.*params/dense/kernel has shape \(2, 3\), "
                                                          r"the stage expects \(2, 5\)"):
        restore_latest(tmp_path / "run", abstract(width=5))
    other = dict(CONFIG, steps=20, optim={"lr": 0.002})
    with pytest.raises(ConfigMismatchError, match=r"optim\.lr: checkpoint 0\.001 != now 0\.002; steps: checkpoint 10 != now 20"):
        restore_latest(tmp_path / "run", abstract(), config=other)
    state, _, stored = restore_latest(tmp_path / "run", abstract(), config=other, force=True)
    assert stored == CONFIG and int(state.step) == 4


def test_training_run_is_a_model_checkpoint(tmp_path):
    config = get_config("micro")
    params = init_params(config, jax.random.key(0))
    checkpointer = StageCheckpointer(tmp_path, CONFIG, config)
    shifted = {step: jax.tree_util.tree_map(lambda p, s=step: p + s, params) for step in (2, 4)}
    for step in (2, 4):
        checkpointer.save(step, at_step(init_train_state(shifted[step], TX, jax.random.key(step)), step),
                          {"step": step})
    checkpointer.close()
    for where, step in ((tmp_path, 4), (tmp_path / "2", 2)):  # the root's latest step, or one step's folder
        loaded_config, loaded = load_model_checkpoint(where)
        assert loaded_config == config
        for a, b in zip(jax.tree_util.tree_leaves(loaded), jax.tree_util.tree_leaves(shifted[step]), strict=True):
            assert np.array_equal(a, b)


def test_corrupt_array_files_name_the_checkpoint_and_the_fallback(tmp_path):
    """A truncated array file in the latest step is a named error pointing at the previous step; nothing is deleted."""
    ckpt = StageCheckpointer(tmp_path, CONFIG, max_to_keep=3)
    ckpt.save(2, at_step(toy_state(), 2))
    ckpt.save(4, at_step(toy_state(seed=1), 4))
    ckpt.close()
    params = tmp_path / "4" / "params"
    data_files = [p for p in params.rglob("*") if p.is_file() and p.parent.name == "d"]  # OCDBT array data
    assert data_files
    for path in data_files:
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 3])
    with pytest.raises(DamagedCheckpointError, match=r"4 cannot be read .*To resume from step 2, move the damaged step "
                                                     rf"out of the run dir \(mv {tmp_path / '4'} {tmp_path}.step4.damaged"):
        restore_latest(tmp_path, abstract(), config=CONFIG)
    assert latest_step(tmp_path) == 4 and (tmp_path / "2").is_dir()


def three_steps(root, config=None):
    checkpointer = StageCheckpointer(root, CONFIG, config, async_save=False)
    params = init_params(config, jax.random.key(0)) if config is not None else None
    for step in (1, 2, 3):
        state = (at_step(init_train_state(params, TX, jax.random.key(step)), step) if params is not None
                 else at_step(toy_state(seed=step), step))
        checkpointer.save(step, state, {"step": step})
    checkpointer.close()


@pytest.mark.parametrize("damage", ["params/_METADATA", "opt_state/manifest.ocdbt", "meta/metadata",
                                    "_CHECKPOINT_METADATA", "config"])
def test_a_damaged_newest_step_is_named_never_skipped_silently(tmp_path, caplog, damage):
    three_steps(tmp_path)
    target = tmp_path / "3" / damage
    if target.is_dir():
        import shutil
        shutil.rmtree(target)
    else:
        target.unlink()
    scan = scan_steps(tmp_path, ("params", "opt_state", "rng", "meta", "data_state", "config"))
    assert scan.complete == (1, 2) and list(scan.damaged) == [3]
    assert latest_step(tmp_path) == 2
    with caplog.at_level("INFO", logger="hat_jax.checkpoints"):
        state, data_state, _ = restore_latest(tmp_path, abstract())
    assert int(state.step) == 2 and data_state == {"step": 2}
    warning = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warning) == 1 and "newer step(s) 3 incomplete or unreadable (step 3: " in warning[0]
    assert "using step 2. To resume from step 2, move the damaged step out of the run dir" in warning[0]
    assert f"restored step 2 of {tmp_path}" in caplog.text
    # a writer refuses to resume over it: it would write step 3 again
    with pytest.raises(DamagedCheckpointError, match=r"newer step\(s\) 3 incomplete .*using step 2"):
        check_resumable(tmp_path)
    assert (tmp_path / "3").is_dir()  # nothing is moved or deleted


def test_a_truncated_metadata_file_is_damage_too(tmp_path):
    three_steps(tmp_path)
    meta = tmp_path / "3" / "params" / "_METADATA"
    meta.write_bytes(meta.read_bytes()[:10])
    assert scan_steps(tmp_path).damaged == {3: "params/_METADATA is unreadable (JSONDecodeError)"}
    (tmp_path / "1" / "_CHECKPOINT_METADATA").unlink()
    assert scan_steps(tmp_path).complete == (2,)


def test_model_readers_say_which_step_and_warn(tmp_path, caplog):
    config = get_config("micro")
    three_steps(tmp_path, config)
    (tmp_path / "3" / "params" / "_METADATA").unlink()
    with caplog.at_level("INFO", logger="hat_jax.checkpoints"):
        load_model_checkpoint(tmp_path)
    assert f"loaded the params of step 2 of {tmp_path}" in caplog.text
    assert "newer step(s) 3 incomplete or unreadable (step 3: params/_METADATA is missing)" in caplog.text
    for step in (1, 2):
        (tmp_path / str(step) / "_CHECKPOINT_METADATA").unlink()
    with pytest.raises(DamagedCheckpointError, match=r"has no complete step: step 1: _CHECKPOINT_METADATA is "
                                                     r"missing .*No older complete step exists"):
        load_model_checkpoint(tmp_path)


def test_any_orbax_read_error_becomes_the_named_error(tmp_path, monkeypatch):
    """Orbax raises a bare Exception for a truncated array index: named, with the recovery, no traceback chain."""
    import orbax.checkpoint as ocp

    three_steps(tmp_path)

    def broken(self, step, args=None):
        raise Exception("Encountered error while reading array index")

    monkeypatch.setattr(ocp.CheckpointManager, "restore", broken)
    with pytest.raises(DamagedCheckpointError, match=r"3 cannot be read \(corrupt or truncated files: Exception: "
                                                     r"Encountered error while reading array index\)\. To resume "
                                                     r"from step 2") as err:
        restore_latest(tmp_path, abstract())
    assert err.value.__cause__ is None and err.value.__context__ is None


def test_a_corrupt_model_checkpoint_is_named_with_the_fallback(tmp_path):
    config = get_config("micro")
    three_steps(tmp_path, config)
    for path in (tmp_path / "3" / "params").rglob("*"):
        if path.is_file() and path.parent.name == "d":
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 3])
    with pytest.raises(DamagedCheckpointError, match=r"could not read the Orbax params item .*/3/params.*To resume "
                                                     r"from step 2"):
        load_model_checkpoint(tmp_path)
