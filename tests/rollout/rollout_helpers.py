"""Helpers of the rollout tests: decoding with special tokens kept, and the log-prob convention from a full
log-softmax (scripted decode functions are `policy_helpers.scripted_generate`, run inside a `JaxSampler`)."""

from __future__ import annotations

import numpy as np


def decode_text(tokenizer, ids):
    return tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)


def reference_logprobs(logp, ids):
    """The contract's convention from a log-softmax [B, T, V]: entry t = logp[t-1][ids[t]], entry 0 = 0."""
    out = np.zeros(ids.shape, np.float32)
    out[:, 1:] = np.take_along_axis(logp[:, :-1], ids[:, 1:, None], axis=-1)[..., 0]
    return out
