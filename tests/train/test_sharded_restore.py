"""State born sharded: on 8 simulated CPU devices no device ever holds more than its share of the parameters.

The 8-device part runs in a subprocess (this file as a script: `python test_sharded_restore.py OUT.json`),
since `--xla_force_host_platform_device_count` only acts before jax starts. The worker saves a `micro` model
checkpoint, then with every Orbax restore target recorded (`Checkpointer.restore`, `CheckpointManager.restore`):
- reads it as an SFT init onto the fully sharded default mesh (fsdp 4 x expert 2) and builds the stage's
  TrainState (`StageRun.start`: cast + AdamW init inside `jit` with out_shardings);
- saves that state as a stage checkpoint and resumes it on another mesh (fsdp 2 x expert 4): no config-hash
  error (the mesh is not hashed);
- reads the same checkpoint as a bf16 OPD teacher;
- streams a Hugging Face safetensors folder of the model into the mesh (`stream_hf_params`);
- restores a 4-expert checkpoint onto an 8-way expert axis, which cannot hold it.
For every restored or initialised tree it reports each device's bytes, the bytes its shardings imply, the
tree's total, and whether any leaf sits on a single device; the pytest side asserts them exactly.
"""

from __future__ import annotations

import json
import os
import sys

import pytest
from device_worker import run_device_worker

NUM_DEVICES = 8


def _device_bytes(tree) -> dict:
    """{device id: bytes of its addressable shards} over a tree of jax.Arrays."""
    out: dict[int, int] = {}
    for leaf in __import__("jax").tree_util.tree_leaves(tree):
        for shard in leaf.addressable_shards:
            out[shard.device.id] = out.get(shard.device.id, 0) + shard.data.nbytes
    return out


def _expected_bytes(tree) -> int:
    """Bytes one device holds by the leaves' shardings (the largest shard of each leaf, summed)."""
    import numpy as np

    return int(sum(np.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
                   for x in __import__("jax").tree_util.tree_leaves(tree)))


def _describe(tree, mesh) -> dict:
    import jax
    from jax.sharding import NamedSharding

    leaves = jax.tree_util.tree_leaves(tree)
    per_device = _device_bytes(tree)
    return {
        "max_device_bytes": max(per_device.values()), "devices": len(per_device),
        "expected_bytes": _expected_bytes(tree),
        "total_bytes": int(sum(x.nbytes for x in leaves)),
        "all_named_on_mesh": all(isinstance(x.sharding, NamedSharding) and x.sharding.mesh.shape == mesh.shape
                                 for x in leaves),
        "dtypes": sorted({str(x.dtype) for x in leaves}),
    }


def _restore_targets(arg) -> list:
    """The array targets (ShapeDtypeStructs) inside an Orbax restore argument (Composite, StandardRestore, tree)."""
    import jax
    import orbax.checkpoint as ocp

    if isinstance(arg, ocp.args.Composite):
        return [t for key in arg.keys() for t in _restore_targets(arg[key])]
    tree = getattr(arg, "item", arg)
    return [x for x in jax.tree_util.tree_leaves(tree) if isinstance(x, jax.ShapeDtypeStruct)]


def worker(out_path: str) -> None:
    import jax
    import orbax.checkpoint as ocp
    from jax.sharding import SingleDeviceSharding

    from hat_jax.model.checkpoint_io import load_model_checkpoint, save_model_checkpoint
    from hat_jax.model.params import init_params
    from hat_jax.train import checkpoints as ckpt
    from hat_jax.train.opd import load_checkpoint
    from hat_jax.train.optim import OptimConfig, make_optimizer
    from hat_jax.model.sharding import default_mesh
    from hat_jax.train.sft import load_init_params
    from hat_jax.train.stage import StageRun, stage_section

    assert jax.device_count() == NUM_DEVICES
    targets: list = []  # every leaf target handed to an Orbax restore

    def recording(cls):
        original = cls.restore

        def restore(self, *args, **kwargs):
            for a in list(args[1:]) + list(kwargs.values()):
                targets.extend(_restore_targets(a))
            return original(self, *args, **kwargs)

        cls.restore = restore

    recording(ocp.Checkpointer)
    recording(ocp.CheckpointManager)

    root = os.path.dirname(out_path)
    model_config = stage_section("micro", "sft").model_config()
    save_model_checkpoint(os.path.join(root, "init"), init_params(model_config, jax.random.key(0)), model_config)
    targets.clear()
    report: dict = {}

    mesh = default_mesh(None, model_config.num_experts)
    report["mesh"] = dict(mesh.shape)
    params = load_init_params(os.path.join(root, "init"), model_config, "SFT init", mesh)
    report["init_params"] = _describe(params, mesh)
    optimizer = make_optimizer(OptimConfig(total_steps=10))
    cfg = {"name": "test", "mesh": list(mesh.devices.shape)}
    run = StageRun("sft", os.path.join(root, "run"), cfg)
    run.out.mkdir(parents=True)
    state, _ = run.start(model_config, optimizer, mesh, params, seed=0)
    report["state_params"] = _describe(state.params, mesh)
    report["state_opt"] = _describe(state.opt_state, mesh)
    saver = ckpt.StageCheckpointer(run.out, cfg, model_config, async_save=False)
    saver.save(0, state)
    saver.close()

    other = default_mesh((1, 2, 4, 1))
    resumed = StageRun("sft", run.out, {"name": "test", "mesh": [1, 2, 4, 1]}, resume=True)
    state2, _ = resumed.start(model_config, optimizer, other, None, seed=0)
    report["resumed_params"] = _describe(state2.params, other)
    report["resumed_opt"] = _describe(state2.opt_state, other)
    report["resumed_equal"] = all(bool((jax.device_get(a) == jax.device_get(b)).all()) for a, b in
                                  zip(jax.tree_util.tree_leaves(state.params), jax.tree_util.tree_leaves(state2.params)))

    _, teacher = load_checkpoint(os.path.join(root, "init"), "teacher", None, "bfloat16")
    report["teacher"] = _describe(teacher, mesh)

    report["restore_targets"] = len(targets)
    report["single_device_targets"] = sum(isinstance(getattr(t, "sharding", None), SingleDeviceSharding)
                                          for t in targets)
    from hat_jax.model.hf_io import read_safetensors, stream_hf_params, write_safetensors
    from hat_jax.model.hf_mapping import HFLayout, hf_to_params, params_to_hf

    hf = os.path.join(root, "hf")
    host = init_params(model_config, jax.random.key(2))
    os.makedirs(hf)
    write_safetensors(params_to_hf(jax.device_get(host), model_config, HFLayout()), hf)
    streamed, _ = stream_hf_params(hf, model_config, mesh)
    report["hf_streamed"] = _describe(streamed, mesh)
    reference, _, _ = hf_to_params(read_safetensors(hf), model_config)
    report["hf_streamed_equal"] = all(bool((jax.device_get(a) == b).all()) for a, b in
                                      zip(jax.tree_util.tree_leaves(streamed), jax.tree_util.tree_leaves(reference)))
    four = model_config.replace(num_experts=4)
    save_model_checkpoint(os.path.join(root, "four"), init_params(four, jax.random.key(0)), four)
    try:
        load_model_checkpoint(os.path.join(root, "four"), mesh=default_mesh((1, 1, 8, 1)))
        report["bad_mesh_error"] = None
    except ValueError as err:
        report["bad_mesh_error"] = str(err)
    with open(out_path, "w") as f:
        json.dump(report, f)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("sharded_restore") / "report.json")
    run_device_worker(__file__, out, devices=NUM_DEVICES, timeout=300, what="worker")
    with open(out) as f:
        return json.load(f)


def test_default_mesh_is_fully_sharded(report):
    assert report["mesh"] == {"data": 1, "fsdp": 4, "expert": 2, "tensor": 1, "context": 1}


@pytest.mark.parametrize("tree", ["init_params", "state_params", "state_opt", "resumed_params", "resumed_opt",
                                  "teacher", "hf_streamed"])
def test_no_device_holds_more_than_its_share(report, tree):
    r = report[tree]
    assert r["devices"] == NUM_DEVICES and r["all_named_on_mesh"]
    assert r["max_device_bytes"] == r["expected_bytes"]
    # fully sharded: the few replicated leaves (norms, per-head scalars, router) keep a device under 1/6 of the tree
    assert r["max_device_bytes"] * 6 < r["total_bytes"]


def test_dtypes(report):
    assert report["state_params"]["dtypes"] == ["float32"]
    assert report["teacher"]["dtypes"] == ["bfloat16"]


def test_nothing_restored_onto_one_device(report):
    assert report["restore_targets"] > 0 and report["single_device_targets"] == 0


def test_resume_on_another_mesh_gives_the_same_params(report):
    assert report["resumed_equal"]


def test_hf_import_streams_into_the_mesh(report):
    assert report["hf_streamed_equal"]


def test_a_mesh_that_cannot_hold_the_checkpoint_names_the_parameter(report):
    msg = report["bad_mesh_error"]
    assert msg is not None and "cannot be restored onto this mesh" in msg
    assert "four" in msg and "param ['model']['layers_0']['mlp']['experts']" in msg
    assert "dimension 4 is not divisible by mesh axes expert (size 8)" in msg


def test_host_restore_reads_numpy_arrays(tmp_path):
    """Export's read: every parameter into host memory (numpy), equal to what was saved."""
    import jax
    import numpy as np

    from hat_jax.model.checkpoint_io import load_model_checkpoint, save_model_checkpoint
    from hat_jax.model.config import get_config
    from hat_jax.model.params import init_params

    config = get_config("micro")
    params = init_params(config, jax.random.key(1))
    save_model_checkpoint(tmp_path / "ck", params, config)
    _, loaded = load_model_checkpoint(tmp_path / "ck", host=True)
    leaves = jax.tree_util.tree_leaves(loaded)
    assert all(type(x) is np.ndarray for x in leaves)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree_util.tree_leaves(params), leaves))


if __name__ == "__main__":
    worker(sys.argv[1])
