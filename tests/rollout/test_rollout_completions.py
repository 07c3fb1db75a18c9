"""Tests of hat_jax.rollout.completions: OPD rows from the micro model (masks, the rendering, log-probs against an
uncached forward) and chat completions with a scripted decode (order, padding rows, keys, too-long prompts)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from policy_helpers import scripted_generate as scripted
from rollout_helpers import decode_text, reference_logprobs

from hat_jax.model import Qwen3_5MoeForCausalLM
from hat_jax.model.sampling import SamplingConfig
from hat_jax.rollout import JaxSampler, chat_completions, sample_completions
from hat_jax.rollout.completions import chat_prompt_ids

SAMPLING = SamplingConfig(temperature=1.0, max_new_tokens=16)


def test_sample_completions_on_policy(params, config, tokenizer):
    prompts = [[{"role": "user", "content": "宝宝好"}], [{"role": "system", "content": "简短回答。"},
                                                       {"role": "user", "content": "有货吗？"}]]
    out = sample_completions(JaxSampler(params, config, tokenizer), prompts, SAMPLING, jax.random.key(1), n_samples=2)
    b, t = out["input_ids"].shape
    assert b == 4 and t % 64 == 0 and out["group_ids"].tolist() == [0, 0, 1, 1]
    pl, cl = out["prompt_lengths"], out["completion_lengths"]
    col = np.arange(t)[None]
    assert (out["action_mask"] == ((col >= pl[:, None]) & (col < (pl + cl)[:, None]))).all()
    assert (out["attention_mask"] == (col < (pl + cl)[:, None])).all()
    for i in range(b):
        text = tokenizer.apply_chat_template(prompts[i // 2], tokenize=False, add_generation_prompt=True)
        assert decode_text(tokenizer, out["input_ids"][i, :pl[i]]) == text
        assert out["finished"][i] == (out["input_ids"][i, pl[i] + cl[i] - 1] == tokenizer.eos_token_id)
    model = Qwen3_5MoeForCausalLM(config)
    logits = jax.jit(lambda ids, m: model.apply({"params": params}, ids, attention_mask=m).logits)(
        out["input_ids"], out["attention_mask"])
    ref = reference_logprobs(np.asarray(jax.nn.log_softmax(logits)), out["input_ids"])
    act = out["action_mask"] == 1
    np.testing.assert_allclose(out["old_logprobs"][act], ref[act], atol=1e-4)
    assert (out["old_logprobs"][~act] == 0).all()
    with pytest.raises(ValueError, match=r"prompts\[0\] has \d+ tokens, no room below seq_len=8"):
        sample_completions(JaxSampler(params, config, tokenizer), prompts, SAMPLING, jax.random.key(1), seq_len=8)


def test_chat_completions_order_rows_keys_and_too_long(config, tokenizer):
    """Prompts sorted by length into chunks of 2, every chunk in 2 rows, chunk c keyed fold_in(key(seed), c); the
    completion of each prompt comes back in its place, its final `<|im_end|>` removed; a prompt too long for
    max_position_embeddings is not generated."""
    calls = []
    decode = scripted(tokenizer, lambda prompt: prompt.split("<|im_start|>user\n")[1].split("<|im_end|>")[0]
                      + "<|im_end|>")

    def recording(params, cfg, ids, mask, rng, sampling, **kw):
        calls.append((ids.shape, np.asarray(jax.random.key_data(rng))))
        return decode(params, cfg, ids, mask, rng, sampling, **kw)

    prompts = ["a much longer question about the stock", "hi", "价格 " * 5000, "price?"]
    sampler = JaxSampler(None, config, tokenizer, bucket=64, generate_fn=recording)
    out = chat_completions(sampler, prompts, SamplingConfig(max_new_tokens=64), batch_size=2, seed=7)
    assert out.texts[:2] == ["a much longer question about the stock", "hi"] and out.texts[3] == "price?"
    assert out.too_long == [False, False, True, False] and out.texts[2] == "" and out.lengths[2] == 0
    assert out.finished == [True, True, False, True]
    assert out.prompt_tokens == [len(chat_prompt_ids(tokenizer, [{"role": "user", "content": p}])) for p in prompts]
    assert [shape[0] for shape, _ in calls] == [2, 2]        # 3 prompts generated: chunks of 2 and 1, both 2 rows
    keys = [np.asarray(jax.random.key_data(jax.random.fold_in(jax.random.key(7), c))) for c in range(2)]
    assert all(np.array_equal(k, key) for (_, k), key in zip(calls, keys))
    with pytest.raises(ValueError, match="batch_size=0"):
        chat_completions(sampler, prompts, SamplingConfig(max_new_tokens=64), batch_size=0)
