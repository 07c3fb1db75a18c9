"""Config presets, validation errors and the Hugging Face config.json mapping."""

import pytest

from hat_jax.model import get_config, param_counts
from hat_jax.model.config import FULL_ATTENTION, LINEAR_ATTENTION, PRESETS, Qwen3_5MoeTextConfig


def test_presets_have_both_layer_kinds_and_mtp():
    for name in ("micro", "tiny"):
        c = get_config(name)
        assert {LINEAR_ATTENTION, FULL_ATTENTION} <= set(c.layer_types)
        assert c.mtp_num_hidden_layers == 1
    assert get_config("micro").layer_types == (LINEAR_ATTENTION,) * 3 + (FULL_ATTENTION,)


def test_real_preset_matches_the_35b_a3b_config():
    c = get_config("qwen3_6_35b_a3b")
    assert (c.hidden_size, c.num_hidden_layers, c.num_experts, c.num_experts_per_tok) == (2048, 40, 256, 8)
    assert [i for i, t in enumerate(c.layer_types) if t == FULL_ATTENTION] == list(range(3, 40, 4))
    assert c.rotary_dim == 64 and c.linear_conv_dim == 8192


def test_real_preset_parameter_counts_match_arch_md():
    counts = param_counts(get_config("qwen3_6_35b_a3b"))
    assert abs(counts["total"] / 34.66e9 - 1) < 0.01
    assert abs(counts["active"] / 3.45e9 - 1) < 0.01
    assert abs(counts["mtp"] / 0.85e9 - 1) < 0.01
    assert counts["experts"] == 40 * 256 * 3 * 2048 * 512
    # the MTP block per token: its 8 of 256 routed experts, everything else whole
    assert counts["mtp_active"] == counts["mtp"] - (256 - 8) * 3 * 2048 * 512


def test_unknown_preset_lists_valid_ones():
    with pytest.raises(ValueError, match="unknown preset 'tinny'.*Did you mean.*tiny.*Valid presets: micro, tiny"):
        get_config("tinny")


def test_unknown_field_lists_valid_ones():
    with pytest.raises(ValueError, match="unknown config field 'num_expert'.*num_experts"):
        get_config("micro", num_expert=4)
    with pytest.raises(ValueError, match="unknown config field"):
        get_config("micro").replace(hidden=3)


def test_inconsistent_values_name_the_field():
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        get_config("micro", num_experts_per_tok=9)
    with pytest.raises(ValueError, match="layer_types has 2 entries"):
        get_config("micro", layer_types=(LINEAR_ATTENTION, FULL_ATTENTION))


def test_replace_num_layers_rederives_layer_types():
    c = get_config("micro").replace(num_hidden_layers=8)
    assert c.layer_types.count(FULL_ATTENTION) == 2


def test_hf_dict_round_trip_keeps_unknown_keys():
    c = get_config("tiny")
    d = c.to_hf_dict()
    assert d["model_type"] == "qwen3_5_moe_text" and d["rope_parameters"]["partial_rotary_factor"] == 0.25
    d["some_future_key"] = {"a": 1}
    c2 = Qwen3_5MoeTextConfig.from_hf_dict(d)
    assert c2.replace(extra=()) == c
    assert c2.to_hf_dict()["some_future_key"] == {"a": 1}


def test_hf_dict_accepts_the_vl_wrapper_and_transformers_config():
    transformers = pytest.importorskip("transformers")
    c = get_config("micro")
    hf = transformers.Qwen3_5MoeTextConfig(**{k: v for k, v in c.to_hf_dict().items() if k != "model_type"})
    back = Qwen3_5MoeTextConfig.from_hf_dict(hf.to_dict())
    assert back.replace(extra=()) == c.replace(extra=())
    wrapped = Qwen3_5MoeTextConfig.from_hf_dict({"model_type": "qwen3_5_moe", "text_config": c.to_hf_dict()})
    assert wrapped == c
    with pytest.raises(ValueError, match="model_type 'llama'"):
        Qwen3_5MoeTextConfig.from_hf_dict({"model_type": "llama"})


def test_preset_names():
    assert list(PRESETS) == ["micro", "tiny", "qwen3_6_35b_a3b"]


def test_list_eos_token_id_round_trips():
    c = Qwen3_5MoeTextConfig.from_hf_dict({**get_config("micro").to_hf_dict(), "eos_token_id": [7, 9]})
    assert c.eos_token_ids == (7, 9)
    assert c.to_hf_dict()["eos_token_id"] == [7, 9]
    assert Qwen3_5MoeTextConfig.from_hf_dict(c.to_hf_dict()) == c


def test_tied_embeddings_are_refused():
    with pytest.raises(ValueError, match="tie_word_embeddings"):
        get_config("micro", tie_word_embeddings=True)


@pytest.mark.parametrize("overrides,field", [
    (dict(num_key_value_heads=0), "num_key_value_heads"),
    (dict(num_experts="8"), "num_experts"),
    (dict(num_experts=0), "num_experts"),
    (dict(vocab_size=-1), "vocab_size"),
    (dict(num_hidden_layers=0), "num_hidden_layers"),
    (dict(num_hidden_layers="four", layer_types=()), "num_hidden_layers"),
    (dict(num_hidden_layers=2.5, layer_types=()), "num_hidden_layers"),
    (dict(full_attention_interval=0, layer_types=()), "full_attention_interval"),
    (dict(eos_token_id=9999), "eos_token_id"),
    (dict(pad_token_id=-5), "pad_token_id"),
    (dict(rope_parameters={"rope_theta": 1e4}), "mrope_section"),
])
def test_bad_values_name_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        get_config("micro", **overrides)
