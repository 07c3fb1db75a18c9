"""Expert parallelism (`hat_jax.model.expert_parallel`) equals the global dispatch on 8 simulated CPU devices.

As in test_sharding.py, the multi-device part runs in a subprocess (this file executed as a script with
`--xla_force_host_platform_device_count=8`) that writes a JSON report; the pytest process checks it. On a mesh
fsdp 2 x expert 4 (2 experts per device, each device's rows exchanged with the 3 other expert devices of its
fsdp group), fp32:
- `ragged_exchange` (CPU: the dense all_to_all equivalent) against the exchange computed by hand in numpy, and
  its gradient (the custom VJP: the reverse exchange) against the hand-computed transpose;
- `expert_dispatch` with `ep_ragged_dot` and `ep_megablox` against `blocked_expert_ffn` on the global arrays:
  output and gradients w.r.t. x, gate_up and down, for random routing, for every token on one device's experts
  (the dropless worst case) and for a row count the 8 batch devices do not divide (padding);
- the MoE block with routing replay (`forced_expert_ids`) under the mesh against the block without one:
  outputs and gradients w.r.t. every parameter and the input;
- the compiled HLO: all-to-alls present, no all-gather of a full [E, ...] expert weight;
- an 'expert' axis of 3 for 8 experts fails naming both.
`received_to_grouped` and the option validation are checked in-process against hand-computed values.
"""

from __future__ import annotations

import json
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from device_worker import run_device_worker
from hat_jax.model.expert_parallel import check_expert_axis, received_to_grouped

NUM_DEVICES = 8
MESH = dict(fsdp=2, expert=4)
N, H, E, I, K = 64, 16, 8, 6, 2


def _rel(a, b) -> float:
    return float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))


# --------------------------------------------------------------------------------------------------
# Worker (subprocess with 8 host devices)
# --------------------------------------------------------------------------------------------------
def _exchange_worker() -> dict:
    """ragged_exchange over 'expert' (P = 4) on the fsdp 2 x expert 4 mesh: each device (f, d) sends
    counts[f][s, d'] rows to d'; compared with a numpy exchange, and the VJP with the numpy transpose."""
    from hat_jax.model.expert_parallel import ragged_exchange
    from hat_jax.model.sharding import make_mesh

    p, m, out_rows = 4, 6, 12
    rng = np.random.default_rng(1)
    counts = np.zeros((2, p, p), np.int32)
    for f in range(2):
        for s in range(p):
            c = rng.multinomial(rng.integers(0, m + 1), np.ones(p) / p)
            counts[f, s] = c
    counts[0, :, 2] = [3, 3, 3, 3]  # device 2 of group 0 receives the most (12 rows = out_rows)
    counts[0, :, [0, 1, 3]] = np.minimum(counts[0, :, [0, 1, 3]], 1)
    assert counts.sum(-1).max() <= m and counts.sum(1).max() <= out_rows
    x = rng.normal(size=(2, p, m, 3)).astype(np.float32)          # [fsdp, expert device, rows, 3]
    w = rng.normal(size=(2, p, out_rows, 3)).astype(np.float32)   # weights of the loss sum(w * out)

    want = np.zeros((2, p, out_rows, 3), np.float32)
    want_grad = np.zeros_like(x)
    for f in range(2):
        for d in range(p):
            row = 0
            for s in range(p):
                start = counts[f, s, :d].sum()
                c = counts[f, s, d]
                want[f, d, row:row + c] = x[f, s, start:start + c]
                want_grad[f, s, start:start + c] = w[f, d, row:row + c]
                row += c

    mesh = make_mesh(**MESH)
    spec = jax.sharding.PartitionSpec(("fsdp", "expert"))

    def body(x, counts, w):
        out = ragged_exchange(x[0], counts[0], out_rows, "expert")
        grad = jax.grad(lambda a: jnp.sum(w[0] * ragged_exchange(a, counts[0], out_rows, "expert")))(x[0])
        return out[None], grad[None]

    f = jax.shard_map(body, mesh=mesh, in_specs=(spec, spec, spec), out_specs=(spec, spec), check_vma=False)
    counts_rep = np.repeat(counts, p, axis=0)                      # [8, P, P]: each device its group's counts
    out, grad = jax.jit(f)(x.reshape(8, m, 3), counts_rep, w.reshape(8, out_rows, 3))
    return {"out": float(np.abs(np.asarray(out) - want.reshape(8, out_rows, 3)).max()),
            "grad": float(np.abs(np.asarray(grad) - want_grad.reshape(8, m, 3)).max())}


def _dispatch_worker() -> dict:
    """{case/impl: {"out": max |diff|, "grads": [relative max |diff| for x, gate_up, down], "a2a": count,
    "full_weight_gathers": count}} against `blocked_expert_ffn` without a mesh."""
    from hat_jax.model.moe import blocked_expert_ffn, expert_dispatch
    from hat_jax.model.sharding import make_mesh, mesh_context
    from moe_helpers import expert_inputs

    r = np.random.RandomState(0)
    x, ids, gate_up, down = expert_inputs(r, N, E, K, H, I, scale=0.3)
    skewed = jnp.asarray(np.stack([r.choice(2, K, replace=False) for _ in range(N)]), jnp.int32)  # experts 0, 1
    cases = {"random": (x, ids), "one_device": (x, skewed), "rows_60": (x[:60], ids[:60])}
    mesh = make_mesh(**MESH)
    weight_sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("expert", "fsdp", None))
    out = {}
    for case, (xc, idc) in cases.items():
        loss = lambda ffn: lambda a, g, d: jnp.sum(jnp.sin(ffn(a, idc, g, d)))
        ref = blocked_expert_ffn(xc, idc, gate_up, down)
        ref_g = jax.grad(loss(blocked_expert_ffn), argnums=(0, 1, 2))(xc, gate_up, down)
        for impl in ("ep_ragged_dot", "ep_megablox"):
            ffn = lambda a, i, g, d, impl=impl: expert_dispatch(impl, a, i, g, d)
            g_s, d_s = jax.device_put(gate_up, weight_sharding), jax.device_put(down, weight_sharding)
            with mesh_context(mesh):
                got = jax.jit(ffn)(xc, idc, g_s, d_s)
                got_g = jax.jit(jax.grad(loss(ffn), argnums=(0, 1, 2)))(xc, g_s, d_s)
                hlo = jax.jit(jax.grad(loss(ffn), argnums=(0, 1, 2))).lower(xc, g_s, d_s).compile().as_text()
            gathered = re.findall(r"= f32\[([0-9,]+)\]\S* all-gather\(", hlo)
            out[f"{case}/{impl}"] = {
                "out": float(jnp.max(jnp.abs(got - ref))), "grads": [_rel(a, b) for a, b in zip(got_g, ref_g)],
                "a2a": hlo.count("all-to-all("), "full_weight_gathers": sum(s.split(",")[0] == str(E) for s in gathered),
                "local_weight_gathers": sum(s.split(",")[0] == str(E // MESH["expert"]) for s in gathered),
                "grad_shardings": [str(g.sharding.spec) for g in got_g[1:]]}
    return out


def _replay_worker() -> dict:
    """The micro MoE block with forced expert ids, ep_ragged_dot under the mesh vs blocked without one."""
    from hat_jax.model import get_config
    from hat_jax.model.moe import SparseMoeBlock
    from hat_jax.model.sharding import make_mesh, mesh_context

    config = get_config("micro")
    x = jax.random.normal(jax.random.key(2), (4, 16, config.hidden_size))
    forced = jnp.argsort(jax.random.uniform(jax.random.key(4), (64, config.num_experts)), axis=-1)[
        :, :config.num_experts_per_tok].astype(jnp.int32)  # distinct per token
    variables = SparseMoeBlock(config).init(jax.random.key(5), x)

    def run(impl):
        block = SparseMoeBlock(config, impl=impl)

        def loss(params, x):
            y, _, ids = block.apply({"params": params}, x, forced_expert_ids=forced)
            return jnp.sum(jnp.sin(y)), (y, ids)

        return jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))(variables["params"], x)

    (ref_gp, ref_gx), (ref_y, ref_ids) = run("blocked")
    with mesh_context(make_mesh(**MESH)):
        (gp, gx), (y, ids) = run("ep_ragged_dot")
    grads = jax.tree.map(_rel, gp, ref_gp)
    return {"ids_equal": bool(jnp.all(ids == forced) and jnp.all(ref_ids == forced)),
            "out": float(jnp.max(jnp.abs(y - ref_y))), "grad_x": _rel(gx, ref_gx),
            "grads": {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_flatten_with_path(grads)[0]}}


def _bad_axis_worker() -> str:
    from hat_jax.model.moe import expert_dispatch
    from hat_jax.model.sharding import make_mesh, mesh_context

    x, ids = jnp.zeros((12, H)), jnp.zeros((12, K), jnp.int32)
    with mesh_context(make_mesh(fsdp=2, expert=3, devices=jax.devices()[:6])):
        try:
            jax.jit(lambda a: expert_dispatch("ep_ragged_dot", a, ids, jnp.zeros((E, H, 2 * I)),
                                              jnp.zeros((E, I, H))))(x)
        except ValueError as err:
            return str(err)
    return "no error"


def _worker(out_path: str) -> None:
    assert jax.device_count() == NUM_DEVICES, jax.devices()
    report = {"exchange": _exchange_worker(), "dispatch": _dispatch_worker(), "replay": _replay_worker(),
              "bad_axis": _bad_axis_worker()}
    with open(out_path, "w") as f:
        json.dump(report, f)


# --------------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("expert_parallel") / "report.json")
    run_device_worker(__file__, out, devices=NUM_DEVICES, timeout=900, what="expert-parallel worker")
    with open(out) as f:
        return json.load(f)


def test_ragged_exchange_and_its_gradient_match_the_hand_exchange(report):
    assert report["exchange"] == {"out": 0.0, "grad": 0.0}


@pytest.mark.parametrize("case", ["random", "one_device", "rows_60"])
@pytest.mark.parametrize("impl", ["ep_ragged_dot", "ep_megablox"])
def test_expert_parallel_dispatch_equals_the_global_dispatch(report, case, impl):
    r = report["dispatch"][f"{case}/{impl}"]
    assert r["out"] <= 1e-5 and max(r["grads"]) <= 1e-5, r
    assert r["a2a"] >= 2 and r["full_weight_gathers"] == 0 and r["local_weight_gathers"] >= 2, r
    assert r["grad_shardings"] == ["P('expert', 'fsdp')", "P('expert', None, 'fsdp')"], r  # grads stay sharded


def test_routing_replay_through_expert_parallelism(report):
    r = report["replay"]
    assert r["ids_equal"], r
    assert r["out"] <= 1e-5 and r["grad_x"] <= 1e-5, r
    assert max(r["grads"].values()) <= 1e-5, r
    assert any("experts" in k for k in r["grads"]), r


def test_expert_axis_that_does_not_divide_the_experts_fails(report):
    assert "'expert' axis (size 3) does not divide num_experts (8)" in report["bad_axis"], report["bad_axis"]
    with pytest.raises(ValueError, match=r"'expert' axis \(size 4\) does not divide num_experts \(6\)"):
        check_expert_axis(6, {"fsdp": 2, "expert": 4})
    assert check_expert_axis(8, {"fsdp": 2, "expert": 4}) == 4 and check_expert_axis(8, {}) == 1


def test_received_to_grouped_by_hand():
    # received: s0e0 r0 | s0e1 r1 | s1e0 r2 | s1e1 r3 | s2e0 r4 | pad r5; grouped: e0: r0 r2 r4 | e1: r1 r3 | r5
    order, inverse = received_to_grouped(jnp.array([[1, 1], [1, 1], [1, 0]], jnp.int32), 6)
    assert order.tolist() == [0, 2, 4, 1, 3, 5]
    assert inverse.tolist() == [0, 3, 1, 4, 2, 5]
    # empty segments and a source with two rows for one expert
    order, inverse = received_to_grouped(jnp.array([[0, 2], [3, 0]], jnp.int32), 7)
    assert order.tolist() == [2, 3, 4, 0, 1, 5, 6] and inverse.tolist() == [3, 4, 0, 1, 2, 5, 6]


def test_moe_impl_validation_lists_the_expert_parallel_impls():
    from hat_jax.model.moe import MOE_IMPLS, expert_dispatch

    assert {"ep_ragged_dot", "ep_megablox", "blocked"} <= set(MOE_IMPLS)
    with pytest.raises(ValueError, match=r"moe impl 'ep_bogus': expected one of \[.*'ep_megablox'"):
        expert_dispatch("ep_bogus", jnp.zeros((2, H)), jnp.zeros((2, K), jnp.int32), jnp.zeros((E, H, 2 * I)),
                        jnp.zeros((E, I, H)))


def test_without_a_mesh_the_ep_impls_are_their_token_local_matmuls():
    from hat_jax.model.moe import blocked_expert_ffn, expert_dispatch
    from moe_helpers import expert_inputs

    inputs = expert_inputs(np.random.RandomState(3), 20, E, K, H, I, scale=0.3)
    np.testing.assert_allclose(expert_dispatch("ep_ragged_dot", *inputs), blocked_expert_ffn(*inputs), atol=1e-6)


if __name__ == "__main__":
    _worker(sys.argv[1])
