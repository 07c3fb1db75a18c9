"""Tests of hat_jax.model.speculative (MTP speculative decoding) on the `micro` preset (fp32, CPU).

Two kinds of weights: the random micro model (lm_head x10 and random Gated DeltaNet out_proj, so that every
layer shapes the logits), whose random MTP block accepts almost nothing; and a "drafter" model
(`drafter_params`), whose residual branches are scaled by eps and whose MTP block passes the next token's
embedding through, so that it drafts what the main model predicts from the current token alone (eps = 0: a
perfect drafter, every draft accepted). Compilations: one per k for the shared batch shape.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from hat_jax.model import Qwen3_5MoeForCausalLM, get_config, init_cache, init_params
from hat_jax.model.sampler import generate, left_pad
from hat_jax.model.sampling import SamplingConfig, _Sampling, filtered_logits
from hat_jax.model.speculative import accept_drafts, rewind_cache

N = 12
LENGTHS = (20, 13, 5)


def random_out_proj(params, key):
    """The Gated DeltaNet out_proj (zero at init) drawn N(0, 0.1^2), so the DeltaNet layers change the output."""
    return jax.tree_util.tree_map_with_path(
        lambda path, a: jax.random.normal(key, a.shape) * 0.1 if "out_proj" in jax.tree_util.keystr(path) else a,
        params)


def drafter_params(params, config, eps):
    """Main model's residual branch outputs (o_proj, out_proj, down_proj) scaled by eps; the MTP block's zeroed
    and its fc = [I; 0], so its output is norm(norm(embed(token t+1))): it predicts token t+2 as the main model
    does from token t+1 alone."""
    def scale(path, a):
        names = jax.tree_util.keystr(path)
        branch = any(n in names for n in ("o_proj", "out_proj", "down_proj"))
        return a * (0.0 if names.startswith("['mtp']") else eps) if branch else a

    p = jax.tree_util.tree_map_with_path(scale, params)
    h = config.hidden_size
    return {**p, "mtp": {**p["mtp"], "fc": {"kernel": jnp.concatenate([jnp.eye(h), jnp.zeros((h, h))], 0)}}}


@pytest.fixture(scope="module")
def config():
    return get_config("micro")


@pytest.fixture(scope="module")
def params(config):
    p = random_out_proj(init_params(config, jax.random.key(0)), jax.random.key(1))
    return {**p, "lm_head": {"kernel": p["lm_head"]["kernel"] * 10.0}}


@pytest.fixture(scope="module")
def batch(config):
    rs = np.random.RandomState(0)
    return left_pad([rs.randint(3, config.vocab_size, size=n).tolist() for n in LENGTHS])


def sampling(k, stop=(1,)):
    return SamplingConfig(max_new_tokens=N, stop_token_ids=stop, num_speculative_tokens=k)


@pytest.mark.parametrize("model", ["random", "drafter"])
def test_greedy_tokens_identical_with_speculation(config, params, batch, model):
    p = params if model == "random" else drafter_params(params, config, 0.0)
    plain = generate(p, config, *batch, jax.random.key(0), sampling(0))
    # a stop id that row 0 hits mid-run (and no other token of row 0 before it)
    stop = int(plain.tokens[0, 6])
    first = int(np.argmax(np.asarray(plain.tokens[0]) == stop))
    plain = generate(p, config, *batch, jax.random.key(0), sampling(0, (stop,)))
    assert int(plain.lengths[0]) == first + 1 and bool(plain.finished[0])
    for k in (1, 3):
        spec = generate(p, config, *batch, jax.random.key(0), sampling(k, (stop,)))
        np.testing.assert_array_equal(spec.tokens, plain.tokens)
        np.testing.assert_array_equal(spec.lengths, plain.lengths)
        np.testing.assert_array_equal(spec.finished, plain.finished)
        np.testing.assert_allclose(spec.logprobs, plain.logprobs, atol=1e-5, rtol=0)
        steps, acc = np.asarray(spec.verify_steps), np.asarray(spec.accepted_drafts)
        if model == "drafter":   # every draft accepted: each step emits k + 1 tokens until the end is near
            np.testing.assert_array_equal(acc, k * steps)
            assert (steps <= -(-(np.asarray(plain.lengths) - 1) // (k + 1))).all()
        else:                    # random MTP weights: one token per step
            np.testing.assert_array_equal(steps, np.asarray(plain.lengths) - 1)


def test_cache_after_partial_acceptance_equals_plain_decoding(config, params, batch):
    """A verify step over [t0, t1, t2, wrong] accepts 2 drafts; the rewound cache equals the cache after
    feeding t0, t1, t2 one by one (DeltaNet conv and state; attention K/V on the valid slots)."""
    ids, mask = batch
    b, p = ids.shape
    k = 3
    plain_model = Qwen3_5MoeForCausalLM(config)
    verifier = Qwen3_5MoeForCausalLM(config, cache_steps=True)
    models = {"plain": plain_model, "verifier": verifier}
    jitted = {m: jax.jit(lambda ids, mask, cache, m=m: models[m].apply({"params": params}, ids, attention_mask=mask,
                                                              cache=cache)) for m in ("plain", "verifier")}
    apply = lambda m, *args: jitted["plain" if m is plain_model else "verifier"](*args)
    out = apply(plain_model, ids, mask, init_cache(config, b, p + 2 * (k + 1)))
    t0 = jnp.argmax(out.logits[:, -1], -1).astype(jnp.int32)
    prefill_cache = out.cache
    cache, seq = prefill_cache, [t0]
    for _ in range(3):   # plain decoding of t0, t1, t2
        step = apply(plain_model, seq[-1][:, None], np.ones((b, 1), bool), cache)
        cache = step.cache
        seq.append(jnp.argmax(step.logits[:, 0], -1).astype(jnp.int32))
    wrong = (seq[3] + 1) % config.vocab_size
    drafts = jnp.stack([seq[1], seq[2], wrong], 1)
    ver = apply(verifier, jnp.concatenate([t0[:, None], drafts], 1), np.ones((b, k + 1), bool), prefill_cache)
    s = _Sampling.from_config(SamplingConfig(max_new_tokens=N))
    accepted, emitted, _ = accept_drafts(ver.logits, drafts, jnp.zeros((b, k, 0)), jax.random.key(0), 1, s)
    np.testing.assert_array_equal(accepted, [2] * b)
    np.testing.assert_array_equal(emitted[:, :3], np.stack([seq[1], seq[2], seq[3]], 1))
    spec = rewind_cache(ver.cache, accepted, p, config.layer_types)
    for t, got, want in zip(config.layer_types, spec["layers"], cache["layers"]):
        for name in want:
            if t == "full_attention":   # compact the valid slots of each row
                g = [np.asarray(got[name][r])[np.asarray(spec["valid"][r])] for r in range(b)]
                w = [np.asarray(want[name][r])[np.asarray(cache["valid"][r])] for r in range(b)]
                for gr, wr in zip(g, w):
                    np.testing.assert_allclose(gr, wr, atol=5e-6, rtol=0)   # 4-row vs 1-row matmul rounding
            else:
                np.testing.assert_allclose(got[name], want[name], atol=1e-6, rtol=0)
    np.testing.assert_array_equal(spec["valid"].sum(1), cache["valid"].sum(1))
    # the next token after the rewound cache: same logits as plain decoding
    nxt = apply(plain_model, seq[3][:, None], np.ones((b, 1), bool), spec)
    ref = apply(plain_model, seq[3][:, None], np.ones((b, 1), bool), cache)
    np.testing.assert_allclose(nxt.logits, ref.logits, atol=1e-5, rtol=0)


def exact_marginals(params, config, prompt, s):
    """P(t_1) and P(t_2) of the target (t_0, t_1, t_2 sampled after `prompt`) by enumerating t_0, t_1."""
    v = config.vocab_size
    model = Qwen3_5MoeForCausalLM(config)
    t0, t1 = np.meshgrid(np.arange(v), np.arange(v), indexing="ij")
    seqs = np.concatenate([np.tile(prompt, (v * v, 1)), t0.reshape(-1, 1), t1.reshape(-1, 1)], 1)
    logits = model.apply({"params": params}, jnp.asarray(seqs, jnp.int32)).logits[:, -3:]
    probs = jax.nn.softmax(filtered_logits(logits / s.temperature, s), -1).reshape(v, v, 3, v)
    p0 = np.asarray(probs[0, 0, 0], np.float64)                  # P(t0)
    p1 = np.asarray(probs[:, 0, 1], np.float64)                  # P(t1 | t0)
    p2 = np.asarray(probs[:, :, 2], np.float64)                  # P(t2 | t0, t1)
    m1 = p0 @ p1
    m2 = np.einsum("a,ab,abc->c", p0, p1, p2)
    return m1, m2


def chi_square_p(samples, expected):
    """p-value of Pearson's chi-square of integer samples against probabilities, cells under 5 expected merged."""
    counts = np.bincount(samples, minlength=len(expected)).astype(np.float64)
    exp = expected / expected.sum() * len(samples)
    small = exp < 5
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(exp[~small], exp[small].sum())
    keep = exp > 0
    return stats.chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue


def test_sampled_distribution_is_the_targets():
    """4000 rows of one prompt, k = 2, temperature 1 with top-k 12: the first verify step emits t_1 and t_2
    (N = 3); their marginals match the target's by enumeration (chi-square, fixed seeds)."""
    config = get_config("micro", vocab_size=32)
    p = random_out_proj(init_params(config, jax.random.key(0)), jax.random.key(1))
    p = drafter_params({**p, "lm_head": {"kernel": p["lm_head"]["kernel"] * 4.0}}, config, 1.0)
    prompt = np.array([5, 7, 9, 11], np.int32)
    sc = SamplingConfig(temperature=1.0, top_k=12, max_new_tokens=3, num_speculative_tokens=2)
    m1, m2 = exact_marginals(p, config, prompt, _Sampling.from_config(sc))
    rows = 4000
    out = generate(p, config, np.tile(prompt, (rows, 1)), np.ones((rows, 4), bool), jax.random.key(3), sc)
    tokens = np.asarray(out.tokens)
    rate = np.asarray(out.accepted_drafts).sum() / (2 * np.asarray(out.verify_steps).sum())
    assert 0.2 < rate < 0.95, rate          # both the acceptance and the rejection branches run
    assert chi_square_p(tokens[:, 1], m1) > 1e-3
    assert chi_square_p(tokens[:, 2], m2) > 1e-3


def test_bad_input_names_the_field(config, params, batch):
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        SamplingConfig(max_new_tokens=4, num_speculative_tokens=-1)
    with pytest.raises(ValueError, match="num_speculative_tokens=4"):
        SamplingConfig(max_new_tokens=4, num_speculative_tokens=4)
    no_mtp = config.replace(mtp_num_hidden_layers=0)
    with pytest.raises(ValueError, match="num_speculative_tokens.*mtp_num_hidden_layers"):
        generate(params, no_mtp, *batch, jax.random.key(0), sampling(2))
    with pytest.raises(ValueError, match="num_speculative_tokens.*return_expert_ids"):
        generate(params, config, *batch, jax.random.key(0), sampling(2), return_expert_ids=True)
    no_mtp_params = {name: tree for name, tree in params.items() if name != "mtp"}
    with pytest.raises(ValueError, match=r"num_speculative_tokens=2 .*no MTP weights \(no `mtp` subtree.*"
                                         r"num_speculative_tokens=0.*checkpoint with MTP weights"):
        generate(no_mtp_params, config, *batch, jax.random.key(0), sampling(2))
