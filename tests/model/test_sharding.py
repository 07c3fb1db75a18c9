"""Sharding: the `micro` model on 8 simulated CPU devices gives the single-device logits.

`XLA_FLAGS=--xla_force_host_platform_device_count=8` only takes effect before jax initialises its
backend, so the multi-device part runs in a subprocess: this file, executed as a script
(`python test_sharding.py OUT.npz`). For each mesh in `MESHES` the worker builds `make_mesh(...)`, maps
the params with `logical_to_mesh(params_logical_axes(config), params, mesh)`, `device_put`s params and
inputs (batch sharded with `batch_sharding`), runs the jitted forward, checks that the params really are
split (every leaf's addressable shards have the shape its PartitionSpec implies, and some leaves are
split over several devices), and writes the logits, hidden states and routing to OUT.npz. The pytest
process (one device) computes the same forward unsharded and compares at 1e-5 (fp32).

The rule-table tests run in-process on an `AbstractMesh` (no devices needed): `spec_for` /
`logical_to_mesh` / `make_mesh` error messages (unknown logical axis; a non-divisible dimension names the
parameter), no PartitionSpec naming a mesh axis twice, and the 35B preset's shardings on 64 devices.
"""

from __future__ import annotations

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec

from device_worker import run_device_worker
from hat_jax.model import Qwen3_5MoeForCausalLM, get_config, init_params, params_logical_axes, params_shapes
from hat_jax.model.sharding import (MESH_AXES, batch_sharding, constrain, fitted_spec, indivisible_dim, logical_to_mesh,
                                   make_mesh, mesh_context, spec_for)

NUM_DEVICES = 8
# (data, fsdp, expert, tensor); every micro dimension mapped to a mesh axis divides by these sizes.
MESHES = {
    "data2_expert2_tensor2": dict(data=2, fsdp=1, expert=2, tensor=2),
    "fsdp2_expert2_tensor2": dict(data=1, fsdp=2, expert=2, tensor=2),
}
BATCH, SEQ = 4, 70  # SEQ > 64 crosses a Gated DeltaNet chunk boundary
SEED = 0


def _inputs():
    rng = np.random.default_rng(SEED)
    config = get_config("micro")
    ids = rng.integers(3, config.vocab_size, size=(BATCH, SEQ)).astype(np.int32)
    mask = np.ones((BATCH, SEQ), np.int32)
    mask[1, :9] = 0  # one left-padded row
    ids[1, :9] = config.pad_token_id
    return ids, mask


def _forward(config):
    model = Qwen3_5MoeForCausalLM(config)

    def fwd(params, ids, mask):
        out = model.apply({"params": params}, ids, attention_mask=mask)
        return out.logits, out.hidden, out.expert_ids

    return jax.jit(fwd)


# --------------------------------------------------------------------------------------------------
# Worker (subprocess with 8 host devices)
# --------------------------------------------------------------------------------------------------
def _worker(out_path: str) -> None:
    assert jax.device_count() == NUM_DEVICES, f"expected {NUM_DEVICES} devices, got {jax.devices()}"
    config = get_config("micro")
    params = init_params(config, jax.random.key(SEED))
    axes = params_logical_axes(config)
    ids, mask = _inputs()
    results, report = {}, {}
    for name, sizes in MESHES.items():
        mesh = make_mesh(**sizes)
        shardings = logical_to_mesh(axes, params, mesh)
        sharded = jax.device_put(params, shardings)
        split = []
        for (path, x), sharding in zip(jax.tree_util.tree_flatten_with_path(sharded)[0],
                                       jax.tree_util.tree_leaves(shardings)):
            assert x.sharding == sharding, (jax.tree_util.keystr(path), x.sharding, sharding)
            expected = sharding.shard_shape(x.shape)
            shard_shapes = {tuple(s.data.shape) for s in x.addressable_shards}
            assert shard_shapes == {expected}, (jax.tree_util.keystr(path), shard_shapes, expected)
            assert len(x.addressable_shards) == NUM_DEVICES
            if expected != x.shape:
                split.append((jax.tree_util.keystr(path), list(x.shape), list(expected),
                              len({str(s.index) for s in x.addressable_shards})))
        assert split, f"mesh {name}: no parameter is split across devices"
        bs = batch_sharding(mesh, 2)
        ids_d, mask_d = jax.device_put(ids, bs), jax.device_put(mask, bs)
        assert {tuple(s.data.shape) for s in ids_d.addressable_shards} == {
            (BATCH // (sizes["data"] * sizes["fsdp"] * sizes["expert"]), SEQ)}
        with mesh_context(mesh):  # activation constraints and the token-local MoE dispatch are traced in
            logits, hidden, expert_ids = _forward(config)(sharded, ids_d, mask_d)
        assert len(logits.sharding.device_set) == NUM_DEVICES
        results[f"{name}/logits"] = np.asarray(logits)
        results[f"{name}/hidden"] = np.asarray(hidden)
        results[f"{name}/expert_ids"] = np.asarray(expert_ids)
        report[name] = {"split": split, "logits_sharding": str(logits.sharding.spec)}
        results[f"{name}/generate"], report[name]["cache_rows"] = _decode_worker(config, mesh, sharded, ids, mask)
    report["token_local_experts"] = _moe_worker()
    np.savez(out_path, **results)
    with open(out_path + ".json", "w") as f:
        json.dump(report, f)


def _greedy(config, params, ids, mask):
    """Greedy tokens [B, 6] after the rows' first 20 tokens (left-padded prompts)."""
    from hat_jax.model.sampler import generate
    from hat_jax.model.sampling import SamplingConfig

    return np.asarray(generate(params, config, ids[:, :20], mask[:, :20].astype(bool), jax.random.key(0),
                               SamplingConfig(max_new_tokens=6)).tokens)


def _decode_worker(config, mesh, params, ids, mask):
    """(greedy tokens decoded under the mesh, {cache leaf: rows of one device's shard}): the cache is split
    by rows as the activations are."""
    from hat_jax.model.cache import init_cache

    with mesh_context(mesh):
        tokens = _greedy(config, params, ids, mask)
        cache = jax.jit(lambda: init_cache(config, BATCH, 26))()
    leaves = {"valid": cache["valid"], "k": cache["layers"][config.layer_types.index("full_attention")]["k"],
              "state": cache["layers"][0]["state"], "conv": cache["layers"][0]["conv"]}
    return tokens, {k: v.sharding.shard_shape(v.shape)[0] for k, v in leaves.items()}


def _moe_worker() -> dict:
    """`token_local_experts` under a mesh (each device sorts and multiplies its own rows) against the plain
    call: {impl: [max |diff| of the output, max relative |diff| of the grads wrt x, gate_up, down]}."""
    from hat_jax.model.moe import EXPERT_IMPLS, token_local_experts

    keys = jax.random.split(jax.random.key(SEED), 4)
    x = jax.random.normal(keys[0], (64, 16))
    ids = jax.random.randint(keys[1], (64, 2), 0, 8)
    gate_up, down = jax.random.normal(keys[2], (8, 16, 12)), jax.random.normal(keys[3], (8, 6, 16))
    out = {}
    for impl in EXPERT_IMPLS:
        f = lambda x, g, d, impl=impl: token_local_experts(impl, x, ids, g, d)
        grad = jax.grad(lambda *a: jnp.sum(f(*a) ** 2), argnums=(0, 1, 2))
        ref, ref_g = f(x, gate_up, down), grad(x, gate_up, down)
        with mesh_context(make_mesh(fsdp=2, expert=4)):
            got, got_g = jax.jit(f)(x, gate_up, down), jax.jit(grad)(x, gate_up, down)
            hlo = jax.jit(f).lower(x, gate_up, down).as_text()
        out[impl] = {"out": float(jnp.max(jnp.abs(got - ref))),
                     "grads": [float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b))) for a, b in zip(got_g, ref_g)],
                     "shard_map": "shard_map" in hlo or "manual" in hlo}
    return out


# --------------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def worker_results(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("sharding") / "out.npz")
    run_device_worker(__file__, out, devices=NUM_DEVICES, timeout=900, what="sharding worker")  # ~2 min idle; megablox runs in Pallas interpret mode
    with open(out + ".json") as f:
        report = json.load(f)
    return dict(np.load(out)), report


@pytest.fixture(scope="module")
def reference():
    config = get_config("micro")
    params = init_params(config, jax.random.key(SEED))
    ids, mask = _inputs()
    logits, hidden, expert_ids = _forward(config)(params, jnp.asarray(ids), jnp.asarray(mask))
    return np.asarray(logits), np.asarray(hidden), np.asarray(expert_ids)


def test_token_local_experts_match_the_global_dispatch(worker_results):
    """The MoE dispatch on each device's own rows (fsdp 2 x expert 4) equals the global sort: outputs
    exactly (each token's result depends only on its row), gradients to float32 rounding (summed per device
    then across devices)."""
    _, report = worker_results
    for impl, r in report["token_local_experts"].items():
        assert r["shard_map"], impl
        assert r["out"] <= 1e-4 and max(r["grads"]) < 1e-6, (impl, r)


@pytest.mark.parametrize("mesh_name", list(MESHES))
def test_sharded_forward_matches_single_device(worker_results, reference, mesh_name):
    results, report = worker_results
    ref_logits, ref_hidden, ref_ids = reference
    assert ref_logits.dtype == np.float32
    # Same routing first: a flipped near-tie would make the logit comparison meaningless.
    np.testing.assert_array_equal(results[f"{mesh_name}/expert_ids"], ref_ids)
    np.testing.assert_allclose(results[f"{mesh_name}/logits"], ref_logits, atol=1e-5, rtol=0)
    np.testing.assert_allclose(results[f"{mesh_name}/hidden"], ref_hidden, atol=1e-5, rtol=0)
    assert np.abs(ref_logits).max() > 1e-3  # not a trivially zero output


@pytest.mark.parametrize("mesh_name", list(MESHES))
def test_sharded_decode_matches_single_device_and_splits_the_cache(worker_results, mesh_name):
    """The sampler under the mesh gives the single-device greedy tokens, and its cache (KV, DeltaNet state and
    conv window, valid mask) holds each device's rows only."""
    results, report = worker_results
    config = get_config("micro")
    ids, mask = _inputs()
    np.testing.assert_array_equal(results[f"{mesh_name}/generate"],
                                  _greedy(config, init_params(config, jax.random.key(SEED)), ids, mask))
    sizes = MESHES[mesh_name]
    rows = BATCH // (sizes["data"] * sizes["fsdp"] * sizes["expert"])
    assert report[mesh_name]["cache_rows"] == {"valid": rows, "k": rows, "state": rows, "conv": rows}


@pytest.mark.parametrize("mesh_name", list(MESHES))
def test_params_really_split(worker_results, mesh_name):
    _, report = worker_results
    split = {path: (shape, shard, n) for path, shape, shard, n in report[mesh_name]["split"]}
    sizes = MESHES[mesh_name]
    # experts: [E, H, 2I] on ('expert', 'expert_embed'->fsdp, 'mlp'->tensor)
    path = "['model']['layers_0']['mlp']['experts']['gate_up_proj']"
    assert path in split, sorted(split)
    shape, shard, _ = split[path]
    assert shard == [shape[0] // sizes["expert"], shape[1] // sizes["fsdp"], shape[2] // sizes["tensor"]]
    # lm_head [H, V] on ('embed'->(fsdp, expert), 'vocab'->tensor)
    shape, shard, _ = split["['lm_head']['kernel']"]
    assert shard == [shape[0] // (sizes["fsdp"] * sizes["expert"]), shape[1] // sizes["tensor"]]


# ---- rule-table errors (no devices needed) --------------------------------------------------------
def test_spec_for_maps_logical_names():
    assert spec_for(("expert", "expert_embed", "mlp")) == PartitionSpec("expert", ("fsdp", "context"), "tensor")
    assert spec_for(("vocab", "embed")) == PartitionSpec("tensor", ("fsdp", "expert", "context"))
    assert spec_for(("batch", None)) == PartitionSpec(("data", "fsdp", "expert"), None)
    assert spec_for(("batch", "length", None)) == PartitionSpec(("data", "fsdp", "expert"), "context", None)
    assert spec_for(("tokens", None)) == PartitionSpec(("data", "fsdp", "expert", "context"), None)


def test_fitted_spec_keeps_the_longest_dividing_prefix():
    mesh = {"data": 1, "fsdp": 2, "expert": 4, "tensor": 1}
    assert fitted_spec((8, 3), ("batch", None), mesh) == PartitionSpec(("fsdp", "expert"), None)
    assert fitted_spec((4, 3), ("batch", None), mesh) == PartitionSpec("fsdp", None)  # 4 % 8 != 0
    assert fitted_spec((3, 3), ("batch", None), mesh) == PartitionSpec(None, None)
    assert fitted_spec((16, 8), ("batch", "mlp"), {**mesh, "tensor": 2}) == PartitionSpec(("fsdp", "expert"), "tensor")
    assert indivisible_dim((4, 3), PartitionSpec(("fsdp", "expert"), None), mesh) == (4, ("fsdp", "expert"), 8)
    assert indivisible_dim((8, 3), PartitionSpec(("fsdp", "expert"), None), mesh) is None


def test_constrain_is_the_identity_without_a_mesh():
    x = jnp.arange(6.0).reshape(2, 3)
    assert constrain(x, ("batch", None)) is x
    with pytest.raises(ValueError, match=r"2 logical names \('batch', None\) for an array of shape \(6,\)"):
        constrain(jnp.arange(6.0), ("batch", None))


def test_spec_for_unknown_axis_raises():
    with pytest.raises(ValueError, match=r"logical axis 'no_such_axis' has no rule"):
        spec_for(("embed", "no_such_axis"))


def test_logical_to_mesh_unknown_axis_raises():
    mesh = AbstractMesh((1, 1, 1, 1, 1), MESH_AXES)
    axes = {"w": PartitionSpec("embed", "bogus")}
    shapes = {"w": jax.ShapeDtypeStruct((4, 4), jnp.float32)}
    with pytest.raises(ValueError, match="'bogus'"):
        logical_to_mesh(axes, shapes, mesh)


def test_logical_to_mesh_non_divisible_names_parameter():
    config = get_config("micro")  # num_experts = 8
    mesh = AbstractMesh((1, 1, 3, 1, 1), MESH_AXES)
    with pytest.raises(ValueError) as info:
        logical_to_mesh(params_logical_axes(config), params_shapes(config), mesh)
    msg = str(info.value)
    # the first parameter in tree order that does not divide: lm_head's hidden dim 64 over fsdp x expert = 3
    assert msg.startswith("param ['lm_head']['kernel'] shape (64, 512): dimension 64 is not divisible"), msg
    assert "'expert'" in msg and "(size 3)" in msg, msg


@pytest.mark.parametrize("preset", ["micro", "qwen3_6_35b_a3b"])
def test_default_rules_have_no_duplicate_mesh_axes(preset):
    # NamedSharding rejects a spec naming one mesh axis twice (this caught mtp/fc/kernel once mapping
    # ('mtp_fc_in', 'embed') to ('fsdp', 'fsdp')).
    config = get_config(preset)
    flat = jax.tree_util.tree_flatten_with_path(params_logical_axes(config),
                                                is_leaf=lambda x: isinstance(x, PartitionSpec))[0]
    bad = []
    for path, logical in flat:
        used = [a for entry in spec_for(tuple(logical)) if entry
                for a in (entry if isinstance(entry, tuple) else (entry,))]
        if len(used) != len(set(used)):
            bad.append((jax.tree_util.keystr(path), tuple(logical)))
    assert not bad, f"params mapping one mesh axis to two dimensions: {bad}"


def test_logical_to_mesh_abstract_mesh_shard_shapes():
    config = get_config("micro")
    mesh = AbstractMesh((1, 2, 2, 2, 1), MESH_AXES)
    shardings = logical_to_mesh(params_logical_axes(config), params_shapes(config), mesh)
    s = shardings["model"]["layers_0"]["mlp"]["experts"]["gate_up_proj"]
    assert isinstance(s, NamedSharding)
    assert s.shard_shape((8, 64, 64)) == (4, 32, 32)
    fc = shardings["mtp"]["fc"]["kernel"]
    assert len({a for a in fc.spec if a is not None}) == len([a for a in fc.spec if a is not None])


def test_logical_to_mesh_35b_on_64_device_abstract_mesh():
    config = get_config("qwen3_6_35b_a3b")  # shapes only, nothing allocated
    mesh = AbstractMesh((1, 8, 8, 1, 1), MESH_AXES)
    shardings = logical_to_mesh(params_logical_axes(config), params_shapes(config), mesh)
    experts = shardings["model"]["layers_0"]["mlp"]["experts"]["gate_up_proj"]
    assert experts.shard_shape((256, 2048, 1024)) == (32, 256, 1024)
    # dense weights are split over all 64 devices too (fsdp x expert), not only the 8 fsdp ones
    assert shardings["lm_head"]["kernel"].shard_shape((2048, 248320)) == (32, 248320)
    q_proj = shardings["model"]["layers_3"]["self_attn"]["q_proj"]["kernel"]
    assert q_proj.shard_shape((2048, 8192)) == (32, 8192)


def test_make_mesh_wrong_device_count_raises():
    with pytest.raises(ValueError, match="needs 8 devices"):
        make_mesh(data=2, fsdp=2, expert=2, tensor=1, devices=jax.devices()[:1])


if __name__ == "__main__":
    _worker(sys.argv[1])
