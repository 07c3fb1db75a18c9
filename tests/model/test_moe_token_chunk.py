"""The token-chunked MoE dispatch (`moe_token_chunk`: `hat_jax.model.moe.routed_experts`) equals the unchunked one.

As in test_expert_parallel.py, the multi-device part runs in a subprocess (this file executed as a script with
`--xla_force_host_platform_device_count=8`) that writes a JSON report; the pytest process checks it. On a mesh
fsdp 2 x expert 4, fp32, 64 token rows (8 per device):
- `routed_experts` token-local (`blocked`) and expert-parallel (`ep_ragged_dot`, `ep_megablox`) with chunks of 4
  rows per device (2 chunks) and of 3 (a chunk that does not divide the 8 rows: padded) against the unchunked
  call under the same mesh: output and gradients w.r.t. x, the routing weights, gate_up and down;
- the micro MoE block with routing replay (`forced_expert_ids`) and ep_ragged_dot, chunked vs unchunked.
In-process: without a mesh, chunked equals unchunked; token_chunk None (and one chunk holding every row) is the
unchunked program (same HLO text; the chunks add one loop); the option's validation names the field and the value.
"""

from __future__ import annotations

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from device_worker import run_device_worker

NUM_DEVICES = 8
MESH = dict(fsdp=2, expert=4)
N, H, E, I, K = 64, 16, 8, 6, 2


def _rel(a, b) -> float:
    return float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))


def _inputs(n=N):
    from moe_helpers import expert_inputs

    r = np.random.RandomState(0)
    x, ids, gate_up, down = expert_inputs(r, n, E, K, H, I, scale=0.3)
    weights = jax.nn.softmax(jnp.asarray(r.randn(n, K), jnp.float32), axis=-1)
    return x, ids, weights, gate_up, down


def _compare(impl, chunk, x, ids, weights, gate_up, down) -> dict:
    """{"out": max |diff|, "grads": [relative max |diff| for x, weights, gate_up, down]} chunked vs unchunked."""
    from hat_jax.model.moe import routed_experts

    def run(c):
        f = lambda a, w, g, d: routed_experts(impl, a, ids, w, g, d, c)
        loss = lambda a, w, g, d: jnp.sum(jnp.sin(f(a, w, g, d)))
        return jax.jit(f)(x, weights, gate_up, down), jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(
            x, weights, gate_up, down)

    (ref, ref_g), (got, got_g) = run(None), run(chunk)
    return {"out": float(jnp.max(jnp.abs(got - ref))), "grads": [_rel(a, b) for a, b in zip(got_g, ref_g)]}


# --------------------------------------------------------------------------------------------------
# Worker (subprocess with 8 host devices)
# --------------------------------------------------------------------------------------------------
def _dispatch_worker() -> dict:
    from hat_jax.model.sharding import make_mesh, mesh_context

    x, ids, weights, gate_up, down = _inputs()
    mesh = make_mesh(**MESH)
    weight_sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("expert", "fsdp", None))
    gate_up, down = jax.device_put(gate_up, weight_sharding), jax.device_put(down, weight_sharding)
    out = {}
    cases = [("blocked", 4), ("blocked", 3), ("ep_ragged_dot", 4), ("ep_ragged_dot", 3), ("ep_megablox", 3)]
    with mesh_context(mesh):
        for impl, chunk in cases:
            out[f"{impl}/{chunk}"] = _compare(impl, chunk, x, ids, weights, gate_up, down)
    return out


def _replay_worker() -> dict:
    """The micro MoE block with forced expert ids under the mesh, ep_ragged_dot chunked (3 rows) vs unchunked."""
    from hat_jax.model import get_config
    from hat_jax.model.moe import SparseMoeBlock
    from hat_jax.model.sharding import make_mesh, mesh_context

    config = get_config("micro")
    x = jax.random.normal(jax.random.key(2), (4, 16, config.hidden_size))
    forced = jnp.argsort(jax.random.uniform(jax.random.key(4), (64, config.num_experts)), axis=-1)[
        :, :config.num_experts_per_tok].astype(jnp.int32)  # distinct per token
    variables = SparseMoeBlock(config).init(jax.random.key(5), x)

    def run(chunk):
        block = SparseMoeBlock(config, impl="ep_ragged_dot", token_chunk=chunk)

        def loss(params, x):
            y, _, ids = block.apply({"params": params}, x, forced_expert_ids=forced)
            return jnp.sum(jnp.sin(y)), (y, ids)

        return jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))(variables["params"], x)

    with mesh_context(make_mesh(**MESH)):
        (ref_gp, ref_gx), (ref_y, ref_ids) = run(None)
        (gp, gx), (y, ids) = run(3)
    grads = jax.tree.map(_rel, gp, ref_gp)
    return {"ids_equal": bool(jnp.all(ids == forced) and jnp.all(ref_ids == forced)),
            "out": float(jnp.max(jnp.abs(y - ref_y))), "grad_x": _rel(gx, ref_gx),
            "grads": {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_flatten_with_path(grads)[0]}}


def _worker(out_path: str) -> None:
    assert jax.device_count() == NUM_DEVICES, jax.devices()
    report = {"dispatch": _dispatch_worker(), "replay": _replay_worker()}
    with open(out_path, "w") as f:
        json.dump(report, f)


# --------------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("moe_token_chunk") / "report.json")
    run_device_worker(__file__, out, devices=NUM_DEVICES, timeout=900, what="token-chunk worker")
    with open(out) as f:
        return json.load(f)


@pytest.mark.parametrize("case", ["blocked/4", "blocked/3", "ep_ragged_dot/4", "ep_ragged_dot/3", "ep_megablox/3"])
def test_chunked_dispatch_equals_unchunked_on_the_mesh(report, case):
    r = report["dispatch"][case]
    assert r["out"] <= 1e-5 and max(r["grads"]) <= 1e-5, r


def test_routing_replay_through_the_chunked_expert_parallel_dispatch(report):
    r = report["replay"]
    assert r["ids_equal"], r
    assert r["out"] <= 1e-5 and r["grad_x"] <= 1e-5, r
    assert max(r["grads"].values()) <= 1e-5, r
    assert any("experts" in k for k in r["grads"]), r


@pytest.mark.parametrize("impl,chunk", [("blocked", 16), ("ragged_dot", 25), ("ep_ragged_dot", 7)])
def test_chunked_equals_unchunked_without_a_mesh(impl, chunk):
    r = _compare(impl, chunk, *_inputs(50))
    assert r["out"] <= 1e-5 and max(r["grads"]) <= 1e-5, r


def test_off_is_the_unchunked_program():
    from hat_jax.model.moe import expert_dispatch, routed_experts

    x, ids, weights, gate_up, down = _inputs(32)
    hlo = lambda f: jax.jit(f).lower(x, weights, gate_up, down).as_text()
    plain = hlo(lambda a, w, g, d: jnp.einsum("nkh,nk->nh", expert_dispatch("blocked", a, ids, g, d), w))
    assert hlo(lambda a, w, g, d: routed_experts("blocked", a, ids, w, g, d)) == plain
    assert hlo(lambda a, w, g, d: routed_experts("blocked", a, ids, w, g, d, 32)) == plain  # one chunk: no scan
    chunked = hlo(lambda a, w, g, d: routed_experts("blocked", a, ids, w, g, d, 8))
    assert chunked.count("stablehlo.while") == plain.count("stablehlo.while") + 1  # the scan over 4 chunks


def test_token_chunk_validation_names_the_field():
    from hat_jax.model.moe import routed_experts
    from hat_jax.train.sft import SFTConfig

    with pytest.raises(ValueError, match=r"SFTConfig.moe_token_chunk = 0: expected None or a positive"):
        SFTConfig(moe_token_chunk=0)
    assert SFTConfig(moe_token_chunk=4096).moe_token_chunk == 4096
    with pytest.raises(ValueError, match=r"moe_token_chunk = -1: expected a positive number"):
        routed_experts("blocked", *_inputs(4), -1)


if __name__ == "__main__":
    _worker(sys.argv[1])
