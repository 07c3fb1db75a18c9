"""`hat_jax.model.hf_io` and `hf_mapping`: lossless round trips of safetensors folders, and clear errors on bad
input.

Round trip = import (`load_hf_checkpoint` / `hf_to_params`), then export into the source's own layout
(`save_hf_checkpoint(layout='dropin', source=...)`); every tensor must come back with the same name,
shape, dtype and bytes. Sources: a transformers `save_pretrained` folder (per-expert, `model.`, no MTP),
a fused folder with a per-expert MTP block, a VL-prefix folder with vision tensors, a mixed-dtype folder
(bf16 + fp32 A_log) and a sharded folder with an index. The micro preset keeps every case well under a
second; no model is run here (parity lives in test_hf_parity.py).
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
import torch
import transformers
from tensor_files import raw_tensors
from safetensors.torch import save_file as torch_save_file

from hat_jax.model import Qwen3_5MoeTextConfig, get_config, params_shapes
from hat_jax.model.hf_io import (
    INDEX_FILE, load_hf_checkpoint, read_safetensors, save_hf_checkpoint, text_config_json, write_safetensors,
)
from hat_jax.model.hf_mapping import CheckpointError, HFLayout, hf_to_params, params_to_hf

CONFIG = get_config("micro")
NO_MTP = CONFIG.replace(mtp_num_hidden_layers=0)
VISION = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64,
          "patch_size": 4, "spatial_merge_size": 1, "temporal_patch_size": 2, "num_position_embeddings": 64}


# --------------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------------
def _random_params(config, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)

    def fill(tree):
        return {k: fill(v) if isinstance(v, dict) else (0.05 * rng.standard_normal(v.shape)).astype(np.float32)
                for k, v in tree.items()}
    return fill(params_shapes(config))


def _write_folder(folder, tensors: dict, config_json: dict, **kwargs):
    folder.mkdir(parents=True, exist_ok=True)
    write_safetensors(tensors, folder, **kwargs)
    (folder / "config.json").write_text(json.dumps(config_json, indent=2))
    return folder


def _assert_same_tensors(a, b):
    ta, tb = raw_tensors(a), raw_tensors(b)
    assert sorted(ta) == sorted(tb)
    for name in ta:
        assert ta[name][:2] == tb[name][:2], name
        assert ta[name][2] == tb[name][2], f"{name}: bytes differ"


def _round_trip(src, out, config=None, **kwargs):
    """Import `src`, export into its own layout at `out`; returns the imported params."""
    if config is None:
        config, params, _ = load_hf_checkpoint(src)
    else:
        params, _, _ = hf_to_params(read_safetensors(src), config)
    save_hf_checkpoint(params, config, out, layout="dropin", source=src, **kwargs)
    return params


def _flat(tree, prefix=()):
    for k, v in tree.items():
        yield from _flat(v, prefix + (k,)) if isinstance(v, dict) else [(prefix + (k,), v)]


def _assert_same_params(a, b):
    fa, fb = dict(_flat(a)), dict(_flat(b))
    assert sorted(fa) == sorted(fb)
    for k in fa:
        assert fa[k].dtype == fb[k].dtype and np.array_equal(fa[k], fb[k]), "/".join(k)


@pytest.fixture(scope="module")
def hf_model():
    d = CONFIG.to_hf_dict()
    d.pop("model_type")
    torch.manual_seed(0)
    return transformers.Qwen3_5MoeForCausalLM(transformers.Qwen3_5MoeTextConfig(**d))


@pytest.fixture(scope="module")
def fused_src(tmp_path_factory):
    """Fused main experts, per-expert MTP experts (the official checkpoint's layout), `model.` prefix."""
    tensors = params_to_hf(_random_params(CONFIG), CONFIG, HFLayout("model.", "fused", "per_expert"))
    return _write_folder(tmp_path_factory.mktemp("fused"), tensors, text_config_json(CONFIG, "float32"))


# --------------------------------------------------------------------------------------------------------
# Round trips
# --------------------------------------------------------------------------------------------------------
def test_save_pretrained_folder_round_trips(hf_model, tmp_path):
    src = tmp_path / "src"
    hf_model.save_pretrained(src)
    names = set(raw_tensors(src))
    assert "model.layers.0.mlp.experts.0.gate_proj.weight" in names and not any(n.startswith("mtp.") for n in names)
    _round_trip(src, tmp_path / "out", config=NO_MTP)
    _assert_same_tensors(src, tmp_path / "out")
    assert (tmp_path / "out" / "config.json").read_bytes() == (src / "config.json").read_bytes()


def test_save_pretrained_folder_without_mtp_needs_mtp_free_config(hf_model, tmp_path):
    hf_model.save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match=r"no mtp\.\* tensors.*mtp_num_hidden_layers=0"):
        load_hf_checkpoint(tmp_path)


def test_per_expert_and_fused_folders_import_to_the_same_params(hf_model, tmp_path):
    per_expert = tmp_path / "per_expert"
    hf_model.save_pretrained(per_expert)
    fused = tmp_path / "fused"   # transformers' in-memory state dict is the fused layout
    fused.mkdir()
    torch_save_file({k: v.contiguous() for k, v in hf_model.state_dict().items()}, str(fused / "model.safetensors"))
    a, layout_a, _ = hf_to_params(read_safetensors(per_expert), NO_MTP)
    b, layout_b, _ = hf_to_params(read_safetensors(fused), NO_MTP)
    assert (layout_a.expert_layout, layout_b.expert_layout) == ("per_expert", "fused")
    _assert_same_params(a, b)


def test_fused_folder_with_mtp_round_trips(fused_src, tmp_path):
    names = set(raw_tensors(fused_src))
    assert "model.layers.0.mlp.experts.gate_up_proj" in names
    assert "mtp.layers.0.mlp.experts.7.down_proj.weight" in names and "mtp.fc.weight" in names
    params = _round_trip(fused_src, tmp_path / "out")
    assert "mtp" in params
    _assert_same_tensors(fused_src, tmp_path / "out")


def test_vl_prefix_folder_round_trips_with_vision_tensors(tmp_path):
    tensors = params_to_hf(_random_params(CONFIG, 1), CONFIG, HFLayout("model.language_model.", "per_expert", "fused"))
    tensors["model.visual.patch_embed.proj.weight"] = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    tensors["model.visual.merger.norm.weight"] = np.ones(5, ml_dtypes.bfloat16)
    vl = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
          "text_config": CONFIG.to_hf_dict(), "vision_config": VISION}
    src = _write_folder(tmp_path / "src", tensors, vl)
    _round_trip(src, tmp_path / "out")
    _assert_same_tensors(src, tmp_path / "out")
    assert (tmp_path / "out" / "config.json").read_bytes() == (src / "config.json").read_bytes()


def test_mixed_dtype_folder_round_trips(tmp_path):
    tensors = params_to_hf(_random_params(CONFIG, 2), CONFIG, HFLayout())
    tensors = {n: t if n.endswith("A_log") else t.astype(ml_dtypes.bfloat16) for n, t in tensors.items()}
    src = _write_folder(tmp_path / "src", tensors, text_config_json(CONFIG, "bfloat16"))
    _, params, _ = load_hf_checkpoint(src)
    assert params["model"]["layers_0"]["linear_attn"]["A_log"].dtype == np.float32
    assert params["model"]["layers_0"]["linear_attn"]["dt_bias"].dtype == ml_dtypes.bfloat16
    _round_trip(src, tmp_path / "out")
    _assert_same_tensors(src, tmp_path / "out")


def test_sharded_folder_round_trips(tmp_path):
    tensors = params_to_hf(_random_params(CONFIG, 3), CONFIG, HFLayout())
    src = _write_folder(tmp_path / "src", tensors, text_config_json(CONFIG, "float32"), max_shard_bytes=300_000)
    shards = sorted(p.name for p in src.glob("*.safetensors"))
    assert len(shards) > 2 and (src / INDEX_FILE).exists()
    _round_trip(src, tmp_path / "out", max_shard_bytes=300_000)
    _assert_same_tensors(src, tmp_path / "out")
    index = lambda d: json.loads((d / INDEX_FILE).read_text())
    assert index(tmp_path / "out") == index(src)


# --------------------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------------------
def _edited_copy(fused_src, folder, edit):
    tensors = read_safetensors(fused_src)
    edit(tensors)
    return _write_folder(folder, tensors, json.loads((fused_src / "config.json").read_text()))


def test_missing_tensor_is_named(fused_src, tmp_path):
    name = "model.layers.1.linear_attn.in_proj_z.weight"
    src = _edited_copy(fused_src, tmp_path / "src", lambda t: t.pop(name))
    with pytest.raises(CheckpointError, match=rf"missing tensor '{name}' \(expected shape \(64, 64\)\)"):
        load_hf_checkpoint(src)


def test_unexpected_tensor_is_named(fused_src, tmp_path):
    src = _edited_copy(fused_src, tmp_path / "src",
                       lambda t: t.__setitem__("model.layers.9.mlp.gate.weight", np.zeros((8, 64), np.float32)))
    with pytest.raises(CheckpointError, match=r"unexpected tensor.*model\.layers\.9\.mlp\.gate\.weight"):
        load_hf_checkpoint(src)


def test_shape_mismatch_names_tensor_and_both_shapes(fused_src, tmp_path):
    name = "model.layers.3.self_attn.k_proj.weight"
    src = _edited_copy(fused_src, tmp_path / "src", lambda t: t.__setitem__(name, np.zeros((32, 64), np.float32)))
    with pytest.raises(CheckpointError, match=rf"'{name}' has shape \(32, 64\), expected \(64, 64\)"):
        load_hf_checkpoint(src)


def test_pickle_weights_are_refused(fused_src, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_bytes((fused_src / "config.json").read_bytes())
    torch.save({"lm_head.weight": torch.zeros(2, 2)}, src / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"pytorch_model\.bin.*only safetensors"):
        load_hf_checkpoint(src)


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_corrupt_safetensors_is_refused_and_nothing_is_written(fused_src, tmp_path, damage):
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_bytes((fused_src / "config.json").read_bytes())
    data = (fused_src / "model.safetensors").read_bytes()
    (src / "model.safetensors").write_bytes(data[: len(data) // 2] if damage == "truncated" else b"\x07" * 64)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: cannot read safetensors file"):
        load_hf_checkpoint(src)
    target = tmp_path / "exports" / "out"
    with pytest.raises(CheckpointError, match="cannot read"):
        save_hf_checkpoint(_random_params(CONFIG), CONFIG, target, layout="dropin", source=src)
    assert not target.exists() and not (tmp_path / "exports").exists()


def test_dropin_source_of_another_architecture_is_refused(fused_src, tmp_path):
    other = CONFIG.replace(num_experts=4)
    with pytest.raises(CheckpointError, match=r"different model.*num_experts: 4 vs 8"):
        save_hf_checkpoint(_random_params(other), other, tmp_path / "out", layout="dropin", source=fused_src)
    assert not (tmp_path / "out").exists()


def test_non_empty_output_needs_force(tmp_path):
    params, out = _random_params(CONFIG), tmp_path / "out"
    save_hf_checkpoint(params, CONFIG, out, max_shard_bytes=300_000)
    assert (out / INDEX_FILE).exists()
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(FileExistsError, match="not empty.*force"):
        save_hf_checkpoint(params, CONFIG, out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    save_hf_checkpoint(params, CONFIG, out, force=True)   # one file now: the old shards and index are removed
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary folder left behind


def test_force_replaces_every_model_file_and_cleans_stale_partials(tmp_path):
    params, out = _random_params(CONFIG), tmp_path / "out"
    out.mkdir()
    for name in ("pytorch_model.bin", "pytorch_model.bin.index.json", "vocab.json", "merges.txt", "notes.txt"):
        (out / name).write_text("old")
    stale = tmp_path / ".out.partial-killed"   # what a killed export leaves behind
    stale.mkdir()
    save_hf_checkpoint(params, CONFIG, out, force=True)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "notes.txt"]
    assert not stale.exists()
    assert (out / "model.safetensors").stat().st_mode & 0o777 == 0o644


def test_output_that_is_a_file_is_refused(tmp_path):
    target = tmp_path / "file.txt"
    target.write_text("keep me")
    with pytest.raises(FileExistsError, match="is a file"):
        save_hf_checkpoint(_random_params(CONFIG), CONFIG, target, force=True)
    assert target.read_text() == "keep me"


def test_integer_weights_are_refused(fused_src, tmp_path):
    src = _edited_copy(fused_src, tmp_path / "src",
                       lambda t: t.__setitem__("lm_head.weight", t["lm_head.weight"].astype(np.int8)))
    with pytest.raises(CheckpointError, match=r"'lm_head.weight' has dtype int8.*quantized"):
        load_hf_checkpoint(src)


def test_config_errors_list_valid_choices():
    with pytest.raises(ValueError, match=r"unknown preset 'mikro'.*\['micro'\].*micro, tiny, qwen3_6_35b_a3b"):
        get_config("mikro")
    with pytest.raises(ValueError, match=r"unknown config field 'hiden_size'.*hidden_size.*Valid fields:"):
        get_config("micro", hiden_size=32)
    with pytest.raises(ValueError, match=r"unknown config field 'num_expert'.*num_experts_per_tok"):
        CONFIG.replace(num_expert=4)
    with pytest.raises(ValueError, match=r"model_type 'qwen3_moe'"):
        Qwen3_5MoeTextConfig.from_hf_dict({**CONFIG.to_hf_dict(), "model_type": "qwen3_moe"})
