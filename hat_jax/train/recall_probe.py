"""The base model's recall probe: can it copy a tool name from its context, scored teacher-forced.

Prompts: `hat_jax.data.corpus.recall_probe` prompts (fresh tool chats cut just
before the tool name, in the assistant's `<function=`), scored teacher-forced: prompt + expected name + ">"
is tokenised, the target tokens are those after the longest token prefix it shares with the prompt alone
(the prompt's last token may merge with the name's first piece). "exact" = every target token is the
argmax (equivalently, greedy decoding copies the name exactly, in the tokenizer's own segmentation);
"first_token" = the first target token is the argmax; "name_nll" = mean NLL per target token (nats).
Used by base pretraining (`hat_jax.train.pretrain`, base_report.json) on every base, with one probe set
(`PROBE_SEED`), so bases of different configs are compared on the same items.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from hat_jax.data.corpus import recall_probe, render_chat
from hat_jax.data.reading import (ANSWER_ORDERS, ANSWER_ROLES, answer_order, answer_role, exercise_answer_spans,
                                  reading_chats)
from hat_jax.model.transformer import Qwen3_5MoeForCausalLM
from hat_jax.rollout.logprobs import token_logprobs

PROBE_SEED = 0


def padded_rows(token_ids: Sequence[Sequence[int]], length: int, pad_id: int) -> dict[str, np.ndarray]:
    """{"input_ids", "attention_mask"}: int32 [B, length], one sequence per row, right-padded with pad_id."""
    ids = np.full((len(token_ids), length), pad_id, np.int32)
    mask = np.zeros((len(token_ids), length), np.int32)
    for i, row in enumerate(token_ids):
        ids[i, :len(row)], mask[i, :len(row)] = row, 1
    return {"input_ids": ids, "attention_mask": mask}


def probe_targets(tokenizer, probes) -> list[tuple[list[int], int]]:
    """[(ids of prompt + expected name + ">", c)]: the targets are ids[c:], after the longest token prefix
    shared with the prompt alone (c >= 1), so decode(ids[c:]) = the prompt's tail from c on + name + ">"."""
    rows = []
    for probe in probes:
        prompt = render_chat(probe.messages, probe.tools, add_generation_prompt=True) + probe.assistant_prefix
        a = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        full = list(tokenizer(prompt + probe.expected_name + ">", add_special_tokens=False)["input_ids"])
        c = 0
        while c < min(len(a), len(full)) and a[c] == full[c]:
            c += 1
        rows.append((full, max(c, 1)))
    return rows


def teacher_forced(params, model_config, token_rows: Sequence[Sequence[int]], pad_id: int, *, batch_size: int,
                   dtype=jnp.float32) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Each row of `token_rows` run teacher-forced, in order: (hit bool [T], logprobs float32 [T]) for its T tokens.

    hit[t] = the argmax of position t-1 is token t; logprobs[t] = log p(token t | tokens < t) (`token_logprobs`);
    entry 0 is False / 0. Rows are right-padded to one length (the longest rounded up to 64) and run `batch_size`
    at a time, the last batch filled with repeats, so one shape compiles.
    """
    if not token_rows:
        return
    length = -(-max(len(r) for r in token_rows) // 64) * 64
    batch_size = min(batch_size, len(token_rows))
    model = Qwen3_5MoeForCausalLM(model_config, dtype=dtype)

    @jax.jit
    def score(p, ids, mask):
        logits = model.apply({"params": p}, ids, attention_mask=mask).logits
        hit = jnp.pad(jnp.argmax(logits[:, :-1], axis=-1) == ids[:, 1:], ((0, 0), (1, 0)))
        return hit, token_logprobs(logits, ids)

    for s in range(0, len(token_rows), batch_size):
        chunk = list(token_rows[s:s + batch_size])
        real = len(chunk)
        batch = padded_rows(chunk + [chunk[-1]] * (batch_size - real), length, pad_id)
        hit, lp = jax.device_get(score(params, jnp.asarray(batch["input_ids"]), jnp.asarray(batch["attention_mask"])))
        for i in range(real):
            yield hit[i, :len(chunk[i])], lp[i, :len(chunk[i])]


def recall_probe_figures(params, model_config, tokenizer, n: int, *, seed: int = PROBE_SEED, batch_size: int = 16,
                         dtype=jnp.float32) -> dict:
    """The recall probe of `n` prompts, teacher-forced (module docstring).

    Args:
        params, model_config: the model. tokenizer: its tokenizer. n: probe prompts (`recall_probe(n, seed)`).
        batch_size: prompts per forward (one compiled shape: rows padded to the longest, rounded up to 64).
    Returns:
        {"n", "exact" and "first_token" (shares in [0, 1]), "name_nll" (nats per target token),
        "target_tokens" (mean per probe)}; zeros with n = 0.
    """
    if n == 0:
        return {"n": 0, "exact": 0.0, "first_token": 0.0, "name_nll": 0.0, "target_tokens": 0.0}
    rows = probe_targets(tokenizer, recall_probe(n, seed))
    exact, first, nll, count = [], [], 0.0, 0
    scored = teacher_forced(params, model_config, [f for f, _ in rows], int(tokenizer.pad_token_id or 0),
                            batch_size=batch_size, dtype=dtype)
    for (_, c), (hit, lp) in zip(rows, scored):
        exact.append(bool(hit[c:].all()))
        first.append(bool(hit[c]))
        nll -= float(lp[c:].sum())
        count += len(hit) - c
    return {"n": n, "exact": float(np.mean(exact)), "first_token": float(np.mean(first)), "name_nll": nll / count,
            "target_tokens": count / n}


def reading_gauge_figures(params, model_config, tokenizer, rows: int, *, seed: int = PROBE_SEED, batch_size: int = 32,
                          width: int = 512, dtype=jnp.float32) -> dict:
    """The reading gauge scored zero-shot: `rows` gauge rows per family (`hat_jax.data.reading_gauge`: a tool
    list of the live-stream world's intents, a request, the call), exact = every token of the called name is the
    argmax under teacher forcing. The base never trains on these rows; they test whether its reading carries
    over to the world's intents and to each naming family.

    Args:
        params, model_config: the model. tokenizer: its tokenizer. rows: rows per family (0 = skip).
        seed: row seed (family i draws from random.Random(f"gauge-{seed}-{i}")). batch_size: rows per forward.
        width: the longest row allowed; rows are right-padded to the longest one, rounded up to 32 tokens (a
          character-level tokenizer's rows run past 160).
    Returns:
        {"rows", "exact": {family: share in [0, 1]}}; {"rows": 0, "exact": {}} with rows = 0.
    Raises:
        ValueError: a gauge row longer than `width`.
    """
    import random

    from hat_jax.data.reading_gauge import FAMILIES, exact_names, gauge_batch

    if rows == 0:
        return {"rows": 0, "exact": {}}
    model = Qwen3_5MoeForCausalLM(model_config, dtype=dtype)

    @jax.jit
    def argmax(p, ids, mask):
        return jnp.argmax(model.apply({"params": p}, ids, attention_mask=mask).logits, axis=-1)

    exact = {}
    for i, family in enumerate(FAMILIES):
        batch = gauge_batch(tokenizer, random.Random(f"gauge-{seed}-{i}"), family, -(-rows // batch_size) * batch_size,
                            width)
        used = -(-int(batch["attention_mask"].sum(1).max()) // 32) * 32
        batch = {k: v[:, :used] for k, v in batch.items()}
        hits = [exact_names(np.asarray(argmax(params, batch["input_ids"][s:s + batch_size],
                                              batch["attention_mask"][s:s + batch_size])),
                            batch["input_ids"][s:s + batch_size], batch["name_mask"][s:s + batch_size])
                for s in range(0, len(batch["input_ids"]), batch_size)]
        exact[family] = float(np.mean(np.concatenate(hits)[:rows]))
    return {"rows": rows, "exact": exact}


def _split(exact: list[bool], first: list[bool], labels: list, names: Sequence[str]) -> dict:
    """{name: {"answers", "exact", "first_token"}} over the answers whose label is name (names with none left out)."""
    groups = {n: [i for i, got in enumerate(labels) if got == n] for n in names}
    return {n: {"answers": len(ix), "exact": float(np.mean([exact[i] for i in ix])),
                "first_token": float(np.mean([first[i] for i in ix]))} for n, ix in groups.items() if ix}


def reading_exercise_figures(params, model_config, tokenizer, chats_per_kind: int, kinds: Sequence[str], *,
                             seed: int = 10_000 + PROBE_SEED, batch_size: int = 16, dtype=jnp.float32,
                             symbols: Sequence[str] = ()) -> dict:
    """The reading exercises (`hat_jax.data.reading`) scored teacher-forced, per kind, on fresh chats (a seed the
    pretraining corpus does not use): every answer (a copied value, a called tool's name or an argument's key) is
    scored on its tokens, the tokens that overlap its characters.

    Args:
        params, model_config: the model. tokenizer: its tokenizer (with offsets). chats_per_kind: chats per kind
        (0 = skip). kinds: kinds of `hat_jax.data.reading.KINDS`. batch_size: chats per forward. symbols: the
        exercises' vocabulary symbols (`hat_jax.data.reading.reading_chats`), as the base trained on them.
    Returns:
        {"chats_per_kind", "kinds": {kind: {"answers": count, "exact": share of answers whose every token is the
        argmax, "first_token": share whose first token is, "token_acc": share of answer tokens, and for kinds
        whose answers are listed names, "by_order": {order: {"answers", "exact", "first_token"}} split by where
        the name stands beside its description (`hat_jax.data.reading.answer_order`), and for kinds whose answers
        copy more than one thing, "by_role": {role: {"answers", "exact", "first_token"}} split by what the answer
        copies (`hat_jax.data.reading.answer_role`: name, query, id, key, reply)}}}.
    """
    if chats_per_kind == 0:
        return {"chats_per_kind": 0, "kinds": {}}
    pad = int(tokenizer.pad_token_id or 0)
    out = {}
    for kind in kinds:
        rows = []  # (ids, [(token indices of an answer, its answer_order, its answer_role)])
        for messages, tools in reading_chats(chats_per_kind, seed, kinds=[kind], symbols=symbols):
            text = render_chat(messages, tools)
            enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            turns = [m for m in messages if m["role"] == "assistant"]
            answers = [([t for t, (s, e) in enumerate(enc["offset_mapping"]) if s < b and e > a and t > 0],
                        answer_order(messages, tools, text[a:b]), answer_role(turn))
                       for (a, b), turn in zip(exercise_answer_spans(text, messages), turns)]
            rows.append((enc["input_ids"], [answer for answer in answers if answer[0]]))
        exact, first, orders, roles, right, total = [], [], [], [], 0, 0
        scored = teacher_forced(params, model_config, [ids for ids, _ in rows], pad, batch_size=batch_size,
                                dtype=dtype)
        for (_, answers), (hit, _) in zip(rows, scored):
            for tokens, order, role in answers:
                exact.append(bool(hit[tokens].all()))
                first.append(bool(hit[tokens[0]]))
                orders.append(order)
                roles.append(role)
                right, total = right + int(hit[tokens].sum()), total + len(tokens)
        out[kind] = {"answers": len(exact), "exact": float(np.mean(exact)), "first_token": float(np.mean(first)),
                     "token_acc": right / total}
        if any(o is not None for o in orders):
            out[kind]["by_order"] = _split(exact, first, orders, ANSWER_ORDERS)
        if len(set(roles)) > 1:
            out[kind]["by_role"] = _split(exact, first, roles, ANSWER_ROLES)
    return {"chats_per_kind": chats_per_kind, "kinds": out}
