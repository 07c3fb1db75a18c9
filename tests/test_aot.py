"""`python -m hat_jax.aot`: the micro SFT step compiled for a 4-chip TPU slice (v5p 2x2x1) on this CPU.

libtpu's compiler runs in subprocesses (`JAX_PLATFORMS=cpu`), so the pytest process never loads libtpu. The
compile is kept small (2 layers: one Gated DeltaNet, one attention; 4 rows x 64 tokens). Bad input fails before
compiling: an unknown topology lists the valid names, a mesh of the wrong size names it and the chip count, a
mesh that cannot shard a parameter names the parameter and the mesh. Names and mesh rules are checked
in-process too (no libtpu needed).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from hat_jax.aot.topology import GiB, check_mesh, parse_mesh, resolve_topology
from hat_jax.model.sharding import fully_sharded_shape

needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason="libtpu missing: pip install -e '.[tpu-aot]' (the test extra has it)")
SMALL = ["--preset", "micro", "--topology", "v5p:2x2x1", "--stage", "sft", "--set", "sft.data.batch_size=4",
         "--set", "sft.data.seq_len=64", "--set", "model.num_hidden_layers=2", "--set",
         "model.full_attention_interval=2"]


def _aot(args, tmp_path=None, timeout=300):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, "-m", "hat_jax.aot", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=tmp_path)


@pytest.fixture(scope="module")
def micro_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("aot") / "sft.json"
    proc = _aot([*SMALL, "--json", str(out)])
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text()), proc.stdout


@needs_libtpu
def test_micro_sft_compiles_for_v5p_2x2x1(micro_report):
    report, stdout = micro_report
    assert report["stage"] == "sft" and report["topology"] == "v5p:2x2x1" and report["chips"] == 4
    assert report["hbm_bytes_per_chip"] == 95 * GiB and report["fits"] is True
    assert report["mesh"] == {"data": 1, "fsdp": 2, "expert": 2, "tensor": 1, "context": 1}
    assert [p["name"] for p in report["programs"]] == ["train_step"]
    b = report["bytes_per_chip"]
    assert b["total"] == b["arguments"] + b["outputs"] - b["aliased"] + b["temporaries"] + b["resident"]
    assert b["arguments"] > 0 and b["temporaries"] > 0 and b["resident"] == 0
    assert b["aliased"] > 0  # the state is donated
    # analytic: 6 x (active params - embedding + the MTP block's active params + the lm_head of its logits) x
    # tokens + 6 x (attention layers + the MTP layer) x heads x head_dim x T x tokens (causal; micro trains MTP)
    from hat_jax.model.config import get_config
    from hat_jax.model.params import param_counts

    config = get_config("micro", vocab_size=4096, num_hidden_layers=2, full_attention_interval=2)
    counts = param_counts(config)
    matmul = counts["active"] - 4096 * 64 + counts["mtp_active"] + 64 * 4096
    tokens = 4 * 64
    assert report["analytic_flops_per_chip"] == (6.0 * matmul * tokens + 6.0 * 2 * 4 * 32 * 64 * tokens) / 4
    assert 0.5 < report["flops_per_chip"] / report["analytic_flops_per_chip"] < 3.0
    assert report["collectives"]["all-reduce"]["count"] > 0 and report["collectives"]["all-gather"]["bytes"] > 0
    gathers = report["programs"][0]["expert_weight_all_gathers"]
    assert 0 <= gathers["count"] <= report["collectives"]["all-gather"]["count"]
    assert "of the all-gathers, of expert weights:" in stdout
    assert "train_step: compiled in" in stdout and "HBM 95.0 GiB per chip" in stdout


@needs_libtpu
def test_micro_generate_compiles_one_wave_of_the_rollouts(tmp_path):
    """The sampler compiles for the topology on one wave of the RL batch (rows = rollout_wave_rows), the
    policy's training state counted resident."""
    out = tmp_path / "generate.json"
    args = SMALL[:4] + [
        "--stage", "generate", "--set", "model.num_hidden_layers=2", "--set", "model.full_attention_interval=2",
        "--set", "rl.tasks_per_step=4", "--set", "rl.group_size=2", "--set", "rl.rollout_wave_rows=4",
        "--set", "rl.seq_len=64", "--set", "rl.max_new_tokens=8", "--json", str(out)]
    proc = _aot(args, tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(out.read_text())
    (program,) = report["programs"]
    assert program["name"] == "generate" and program["tokens"] == 4 * 64 and report["fits"] is True
    assert report["bytes_per_chip"]["resident"] > 0 and report["bytes_per_chip"]["temporaries"] > 0


@needs_libtpu
def test_flops_check_compiled_flops_near_the_analytic_count(tmp_path):
    """`--flops-check` on micro (2 layers + the MTP block, v5p 2x2x1, 256 tokens per row): the compiled FLOPs per
    chip are near the analytic count: measured x1.20 (x0.96 at the 35B preset cut to 4 layers,
    docs/real_scale.md). Micro's surplus is the MoE's static padding: the grouped matmul's buffer holds the
    worst case of N x k + E x (block - 1) rows, as many padding rows as real ones at 64 assignments per expert
    and chip (1.34 without the MTP block at hidden 512, the same on an fsdp-only mesh), plus the norms and
    softmaxes the count leaves out. A replicated lm_head (most of micro's FLOPs) would put it above 1.5."""
    out = tmp_path / "flops.json"
    proc = _aot([*SMALL, "--flops-check", "--flops-seq-len", "256", "--json", str(out)])
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(out.read_text())
    (program,) = report["programs"]
    assert report["flops_check"] is True and program["tokens"] == 4 * 256  # one row per batch device
    assert 0.9 < program["flops_ratio"] < 1.3, program["flops_ratio"]


@needs_libtpu
def test_micro_sft_compiles_with_context_parallelism(tmp_path):
    """`--mesh 1,1,2,1,2`: each row's 64 tokens split over a context pair; the TPU program has the mixers'
    collective-permutes (the Gated DeltaNet conv halo and state) and a sequence that the pair cannot split
    evenly fails naming the context axis."""
    out = tmp_path / "sft_cp.json"
    proc = _aot([*SMALL, "--mesh", "1,1,2,1,2", "--json", str(out)])
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["mesh"] == {"data": 1, "fsdp": 1, "expert": 2, "tensor": 1, "context": 2}
    assert report["fits"] is True and report["collectives"]["collective-permute"]["count"] > 0
    proc = _aot([*SMALL, "--mesh", "1,1,2,1,2", "--set", "sft.data.seq_len=63"])
    assert proc.returncode == 2 and "63 tokens" in proc.stderr and "'context' axis (size 2)" in proc.stderr

@needs_libtpu
def test_unknown_topology_lists_valid_names():
    proc = _aot(["--topology", "v5p-7", "--stage", "sft"])
    assert proc.returncode == 2
    assert "unknown TPU topology 'v5p-7'; valid:" in proc.stderr and "v5p-64" in proc.stderr


@needs_libtpu
def test_mesh_errors_name_the_mesh():
    proc = _aot([*SMALL, "--mesh", "1,2,1,1"])
    assert proc.returncode == 2 and "mesh (data=1, fsdp=2, expert=1, tensor=1) has 2 devices, the topology 4" \
        in proc.stderr
    proc = _aot([*SMALL, "--mesh", "1,1,4,1", "--set", "model.num_experts=2"])
    assert proc.returncode == 2
    assert "experts" in proc.stderr and "dimension 2 is not divisible by mesh axes expert (size 4)" in proc.stderr
    proc = _aot([*SMALL, "--set", "sft.mesh=[1,2,1,1]"])  # the stage's own mesh field is the default
    assert proc.returncode == 2 and "mesh (data=1, fsdp=2, expert=1, tensor=1) has 2 devices" in proc.stderr
    proc = _aot([*SMALL, "--mesh", "1,1,4,1", "--set", "sft.mesh=[1,2,2,1]"])
    assert proc.returncode == 2 and "--mesh 1,1,4,1 and sft.mesh = [1, 2, 2, 1] disagree" in proc.stderr
    proc = _aot([*SMALL, "--set", "sft.data.batch_size=2"])  # 2 rows on 4 batch devices
    assert proc.returncode == 2 and "rows of a micro-batch" in proc.stderr and "divide by 4" in proc.stderr
    proc = _aot([*SMALL, "--json", "/proc/no-such-dir/sft.json"])
    assert proc.returncode == 2 and "--json /proc/no-such-dir/sft.json: cannot create its folder" in proc.stderr


def test_bad_arguments_are_refused_before_compiling(tmp_path):
    """A --json that is a folder or in an unwritable one, --flops-seq-len without --flops-check, and a model
    field of the wrong type each exit 2 naming the argument, without a traceback and before any compile."""
    cases = [(["--json", str(tmp_path)], f"--json {tmp_path}: is a folder"),
             (["--json", "/proc/sft.json"], "--json /proc/sft.json: its folder /proc is not writable"),
             (["--flops-seq-len", "512"], "--flops-seq-len: only with --flops-check"),
             (["--set", "model.num_hidden_layers=four"], "num_hidden_layers: expected a positive integer")]
    for extra, message in cases:
        proc = _aot([*SMALL, *extra], timeout=120)
        assert proc.returncode == 2 and message in proc.stderr, (extra, proc.stderr[-2000:])
        assert "Traceback" not in proc.stderr and "compiled in" not in proc.stdout


def test_hlo_collectives_counts_and_sizes():
    from hat_jax.aot.report import hlo_collectives

    hlo = "\n".join([
        "  %all-gather.1 = bf16[8,4096,2048]{2,1,0} all-gather(bf16[1,4096,2048]{2,1,0} %p), dimensions={0}",
        "  %ag-start = (f32[16]{0}, f32[128]{0}) all-gather-start(f32[16]{0} %x), dimensions={0}",
        "  %ag-done = f32[128]{0} all-gather-done((f32[16]{0}, f32[128]{0}) %ag-start)",
        "  %all-reduce.7 = f32[2048,8,128]{2,1,0} all-reduce(f32[2048,8,128]{2,1,0} %y), to_apply=%add",
        "  %add.3 = f32[4]{0} add(f32[4]{0} %a, f32[4]{0} %b)",
    ])
    assert hlo_collectives(hlo) == {
        "all-gather": {"count": 2, "bytes": 8 * 4096 * 2048 * 2 + 128 * 4, "largest": 8 * 4096 * 2048 * 2,
                       "largest_shape": "bf16[8,4096,2048]"},
        "all-reduce": {"count": 1, "bytes": 2048 * 8 * 128 * 4, "largest": 2048 * 8 * 128 * 4,
                       "largest_shape": "f32[2048,8,128]"},
    }


def test_expert_weight_gathers_are_found_by_the_local_experts_shape():
    import jax
    import jax.numpy as jnp

    from hat_jax.aot.report import expert_weight_gathers, expert_weight_shapes

    args = {"params": {"layers": {"mlp": {"experts": {
        "gate_up_proj": jax.ShapeDtypeStruct((10, 256, 2048, 1024), jnp.float32),   # scanned: [blocks, E, H, 2I]
        "down_proj": jax.ShapeDtypeStruct((10, 256, 512, 2048), jnp.float32)}},
        "shared_expert": {"gate_up_proj": jax.ShapeDtypeStruct((10, 2048, 1024), jnp.float32)}}}}
    shapes = expert_weight_shapes(args, {"data": 1, "fsdp": 8, "expert": 8, "tensor": 2})
    # the 32 local experts or all 256, each of the last two dimensions whole or split by tensor (2): 8 shapes
    # per weight; the shared expert none
    local = {(32, 2048, 1024), (32, 1024, 1024), (32, 2048, 512), (32, 1024, 512),
             (32, 512, 2048), (32, 256, 2048), (32, 512, 1024), (32, 256, 1024)}
    assert shapes == local | {(256, a, b) for _, a, b in local}
    hlo = "\n".join([
        "  %ag.1 = bf16[1,32,2048,1024]{3,2,1,0} all-gather(bf16[1,4,2048,1024]{3,2,1,0} %p), dimensions={1}",
        "  %ag.2 = bf16[32,512,2048]{2,1,0} all-gather(bf16[32,64,2048]{2,1,0} %q), dimensions={1}",
        "  %ag.3 = bf16[2048,8192]{1,0} all-gather(bf16[256,8192]{1,0} %r), dimensions={0}",
        "  %ar.4 = bf16[32,2048,1024]{2,1,0} all-reduce(bf16[32,2048,1024]{2,1,0} %s), to_apply=%add",
        "  %ag.5 = bf16[256,512,2048]{2,1,0} all-gather(bf16[32,512,2048]{2,1,0} %t), dimensions={0}",  # token-local
    ])
    assert expert_weight_gathers(hlo, shapes) == {
        "count": 3, "bytes": (32 * 2048 * 1024 + 32 * 512 * 2048 + 256 * 512 * 2048) * 2,
        "largest_shape": "bf16[256,512,2048]"}
    assert expert_weight_gathers("\n".join(hlo.splitlines()[2:4]), expert_weight_shapes(args, {"expert": 32})) == {
        "count": 0, "bytes": 0, "largest_shape": ""}


def test_topology_names_and_meshes():
    t = resolve_topology("v5p-64")
    assert (t.libtpu_name, t.chips, t.hbm_bytes) == ("v5p:4x4x2", 32, 95 * GiB)
    assert (resolve_topology("v6e-64").libtpu_name, resolve_topology("v6e-64").chips) == ("v6e:8x8", 64)
    assert resolve_topology("v5p:2x2x1").chips == 4
    with pytest.raises(ValueError, match=r"unknown TPU topology 'tpu9-8'; valid: .*v5p-128"):
        resolve_topology("tpu9-8")
    assert parse_mesh("1,8,4,1") == (1, 8, 4, 1)
    with pytest.raises(ValueError, match="expected 4 or 5 positive integers data,fsdp,expert,tensor,context"):
        parse_mesh("8,4")
    with pytest.raises(ValueError, match=r"mesh \(data=1, fsdp=8, expert=8, tensor=1\) has 64 devices, the topology 32: "
                                         r"the sizes' product must equal the chips"):
        check_mesh((1, 8, 8, 1), 32)
    from hat_jax.aot.report import size

    assert (size(57.31 * GiB), size(201_479_296), size(0)) == ("57.31 GiB", "192.15 MiB", "0.00 GiB")
    assert fully_sharded_shape(32, 256) == (1, 8, 4, 1) and fully_sharded_shape(64, 256) == (1, 8, 8, 1)
    assert fully_sharded_shape(8, 8) == (1, 4, 2, 1) and fully_sharded_shape(1, 8) == (1, 1, 1, 1)


def test_flops_check_assignments_remove_what_the_cost_model_cannot_count():
    from hat_jax.aot.programs import flops_check_assignments
    from hat_jax.experiments.scales import apply_scale_overrides, get_scale

    sft = apply_scale_overrides(get_scale("qwen3_6_35b_a3b"), flops_check_assignments("sft", 32)).sft
    assert (sft.data.batch_size, sft.data.seq_len, sft.accum_steps) == (32, 4096, 1)
    assert (sft.remat_policy, sft.vocab_chunk, sft.attention_impl, sft.moe_token_chunk) == ("none", None, "xla", None)
    assert sft.moe_impl == "ep_megablox" and sft.scan_layers  # the real step's dispatch and layer scan
    with pytest.raises(ValueError, match="--flops-check: the sft stage only"):
        flops_check_assignments("rl", 32)


@pytest.mark.parametrize("param_dtype, mu_dtype, expected", [("float32", None, ("float32", "float32", "float32")),
                                                             ("float32", "bfloat16", ("float32", "bfloat16", "float32")),
                                                             ("bfloat16", "bfloat16", ("bfloat16",) * 3)])
def test_compiled_state_has_the_stages_param_and_moment_dtypes(param_dtype, mu_dtype, expected):
    """The AOT check's abstract TrainState is the stage's: params, Adam's mu and nu in the config's dtypes."""
    import dataclasses

    import jax

    from hat_jax.aot.programs import _state
    from hat_jax.experiments.scales import get_scale
    from hat_jax.model import get_config
    from hat_jax.model.sharding import make_mesh

    sft = dataclasses.replace(get_scale("micro").sft, param_dtype=param_dtype, mu_dtype=mu_dtype)
    _, state, _ = _state(sft, get_config("micro"), make_mesh(1, 1, 1, 1))
    adam = next(s for s in jax.tree.leaves(state.opt_state, is_leaf=lambda x: hasattr(x, "mu")) if hasattr(s, "mu"))
    dtypes = {str(x.dtype) for x in jax.tree.leaves(state.params)}, {str(x.dtype) for x in jax.tree.leaves(adam.mu)}, \
        {str(x.dtype) for x in jax.tree.leaves(adam.nu)}
    assert dtypes == tuple({d} for d in expected)
