"""Context parallelism (`hat_jax.model.context_parallel`): the sequence split over the mesh's 'context' axis
gives the single-device model's results, on 8 simulated CPU devices.

The multi-device part runs in a subprocess (this file executed as a script with
`--xla_force_host_platform_device_count=8`, as test_sharding.py) that writes a JSON report. fp32, the micro
config (3 Gated DeltaNet + 1 attention layers), 2 rows of 64 tokens:
- loss, logits and the gradient of every parameter under meshes fsdp 2 x context 4 (16 tokens per shard),
  context 8 (8 tokens per shard: the conv's 3-token halo and the recurrence's state cross 7 boundaries) and
  expert 2 x context 4 with expert parallelism, for left-padded rows and for packed rows whose documents
  cross shard boundaries, against the same function without a mesh;
- `context_parallel_attention` with the splash kernel (Pallas interpret mode, 128 tokens per shard) and with
  'xla' against `attention` without a mesh: output and gradients w.r.t. q, k, v;
- a sequence the context axis does not split evenly fails naming the axis size.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from device_worker import run_device_worker

NUM_DEVICES = 8
B, T = 2, 64
MESHES = {"fsdp2_context4": dict(fsdp=2, context=4), "context8": dict(context=8),
          "expert2_context4_ep": dict(expert=2, context=4)}


def _rows():
    from hat_jax.model import get_config

    config = get_config("micro")
    rng = np.random.default_rng(0)
    ids = rng.integers(3, config.vocab_size, size=(B, T)).astype(np.int32)
    mask = np.ones((B, T), np.int32)
    mask[1, :9] = 0  # a left-padded row
    ids[1, :9] = config.pad_token_id
    seg = np.zeros((B, T), np.int32)  # documents crossing the 16- and 8-token shard boundaries, then padding
    seg[0, :20], seg[0, 20:45], seg[0, 45:60] = 1, 2, 3
    seg[1, :30], seg[1, 30:] = 1, 2
    return config, ids, mask, seg


def _model_worker() -> dict:
    import jax
    import jax.numpy as jnp

    from hat_jax.model import Qwen3_5MoeForCausalLM, init_params, params_logical_axes
    from hat_jax.model.sharding import batch_sharding, logical_to_mesh, make_mesh, mesh_context

    config, ids, mask, seg = _rows()
    params = init_params(config, jax.random.key(0))

    def step(moe_impl: str, packed: bool):
        model = Qwen3_5MoeForCausalLM(config, moe_impl=moe_impl)

        def loss(p, ids, mask, seg):
            out = model.apply({"params": p}, ids, attention_mask=None if packed else mask,
                              segment_ids=seg if packed else None)
            logp = jax.nn.log_softmax(out.logits.astype(jnp.float32))
            return jnp.mean(logp[..., 5] * (seg > 0 if packed else mask)), out.logits

        return jax.jit(jax.value_and_grad(loss, has_aux=True))

    report = {}
    for packed in (False, True):
        # One reference per row layout: the default dispatch without a mesh (expert parallelism's dispatch is
        # the same math, so the EP mesh is held to it too; one XLA compile instead of one per mesh).
        (l0, logits0), g0 = step("blocked", packed)(params, ids, mask, seg)
        for name, sizes in MESHES.items():
            sharded_step = step("ep_ragged_dot" if "ep" in name else "blocked", packed)
            mesh = make_mesh(**sizes)
            sharded = jax.device_put(params, logical_to_mesh(params_logical_axes(config), params, mesh))
            rows = batch_sharding(mesh, 2, rows=B)
            with mesh_context(mesh):
                (l1, logits1), g1 = sharded_step(sharded, *(jax.device_put(a, rows) for a in (ids, mask, seg)))
            grad_rel = max(float(jnp.max(jnp.abs(a - b)) / (jnp.max(jnp.abs(b)) + 1e-30))
                           for a, b in zip(jax.tree_util.tree_leaves(g1), jax.tree_util.tree_leaves(g0)))
            report[f"{'packed' if packed else 'padded'}/{name}"] = {
                "loss": [float(l0), float(l1)], "logits_max_diff": float(jnp.max(jnp.abs(logits1 - logits0))),
                "grad_max_rel": grad_rel, "logits_devices": len(logits1.sharding.device_set)}
    return report


def _attention_worker() -> dict:
    import jax
    import jax.numpy as jnp

    from hat_jax.model.attention import attention
    from hat_jax.model.attention_impls import context_parallel_attention
    from hat_jax.model.sharding import make_mesh, mesh_context

    b, t, h, kv, d = 2, 512, 4, 2, 128
    rng = np.random.default_rng(1)
    q, k, v, w = (jnp.asarray(rng.normal(size=s).astype(np.float32))
                  for s in [(b, t, h, d), (b, t, kv, d), (b, t, kv, d), (b, t, h, d)])
    q_ids = np.ones((b, t), np.int32)
    q_ids[1, 200:], q_ids[1, 400:] = 2, 3  # packed documents crossing the 128-token shards
    kv_ids = q_ids.copy()
    kv_ids[0, :30] = 0  # padding keys: row 0's first 30 queries have no key (the fully-masked value)
    scale = d**-0.5
    ref = lambda q, k, v: jnp.sum(attention(q, k, v, q_ids, kv_ids, scale=scale) * w)
    l0, g0 = jax.value_and_grad(ref, argnums=(0, 1, 2))(q, k, v)
    report = {}
    with mesh_context(make_mesh(fsdp=2, context=4)):
        for impl in ("xla", "splash"):
            fn = lambda q, k, v: jnp.sum(context_parallel_attention(
                q, k, v, q_ids, kv_ids, scale=scale, impl=impl, block=128, interpret=True) * w)
            l1, g1 = jax.jit(jax.value_and_grad(fn, argnums=(0, 1, 2)))(q, k, v)
            report[impl] = {"loss": [float(l0), float(l1)],
                            "grad_max_diff": [float(jnp.max(jnp.abs(a - c))) for a, c in zip(g0, g1)]}
        try:
            context_parallel_attention(q[:, :510], k[:, :510], v[:, :510], q_ids[:, :510], kv_ids[:, :510],
                                       scale=scale)
            report["uneven"] = "no error"
        except ValueError as err:
            report["uneven"] = str(err)
    return report


def _worker(out: str) -> None:
    import jax

    assert jax.device_count() == NUM_DEVICES
    with open(out, "w") as f:
        json.dump({"model": _model_worker(), "attention": _attention_worker()}, f)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("context_parallel") / "report.json")
    run_device_worker(__file__, out, devices=NUM_DEVICES, timeout=900, what="context-parallel worker")
    with open(out) as f:
        return json.load(f)


@pytest.mark.parametrize("rows", ["padded", "packed"])
@pytest.mark.parametrize("mesh", list(MESHES))
def test_context_parallel_model_equals_one_device(report, rows, mesh):
    r = report["model"][f"{rows}/{mesh}"]
    assert r["loss"][1] == pytest.approx(r["loss"][0], rel=1e-5, abs=1e-6)
    assert r["logits_max_diff"] < 1e-5
    assert r["grad_max_rel"] < 1e-4
    assert r["logits_devices"] == NUM_DEVICES


@pytest.mark.parametrize("impl", ["xla", "splash"])
def test_context_parallel_attention_equals_attention(report, impl):
    r = report["attention"][impl]
    assert r["loss"][1] == pytest.approx(r["loss"][0], rel=1e-5)
    assert max(r["grad_max_diff"]) < 1e-4


def test_uneven_sequence_names_the_context_axis(report):
    assert "510 tokens" in report["attention"]["uneven"] and "'context' axis (size 4)" in report["attention"]["uneven"]


def test_parse_mesh_takes_an_optional_context_size():
    from hat_jax.aot.topology import parse_mesh

    assert parse_mesh("1,8,4,1,2") == (1, 8, 4, 1, 2)
    with pytest.raises(ValueError, match="expected 4 or 5 positive integers data,fsdp,expert,tensor,context"):
        parse_mesh("1,8,4,1,2,1")


if __name__ == "__main__":
    _worker(sys.argv[1])
