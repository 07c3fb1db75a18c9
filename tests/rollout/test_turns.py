"""Tests of hat_jax.rollout.turns: the environment's turn as the template writes it, and the one reasoning count."""

from __future__ import annotations

from hat_jax.rollout.turns import decode, encode, env_turn_ids, env_turn_text, reasoning_tokens, turn_reasoning


def test_env_turn_text_matches_the_template(tokenizer):
    tool_msgs = [{"role": "tool", "name": "get_stock", "content": '{"stock": 3}'},
                 {"role": "tool", "name": "get_price", "content": '{"price": 9.9}'}]
    assert env_turn_text(tokenizer, tool_msgs) == (
        '\n<|im_start|>user\n<tool_response>\n{"stock": 3}\n</tool_response>\n<tool_response>\n{"price": 9.9}\n'
        '</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n')
    assert env_turn_text(tokenizer, [{"role": "user", "content": " 请精简。 "}]) == (
        "\n<|im_start|>user\n请精简。<|im_end|>\n<|im_start|>assistant\n<think>\n")
    assert env_turn_text(tokenizer, []) == "\n<|im_start|>assistant\n<think>\n"
    assert decode(tokenizer, env_turn_ids(tokenizer, tool_msgs)) == env_turn_text(tokenizer, tool_msgs)


def test_reasoning_is_the_text_before_the_closing_tag_stripped():
    assert turn_reasoning("查库存\n</think>\n\n有货<|im_end|>") == "查库存"
    assert turn_reasoning("  想一想\n") == "想一想"                       # cut while thinking: all reasoning
    assert turn_reasoning("\n</think>\n\n直接回答<|im_end|>") == ""       # an empty block
    assert turn_reasoning("a</think>b</think>c") == "a"                  # the first closing tag ends it


def test_reasoning_tokens_count_the_stripped_reasoning(tokenizer):
    assert reasoning_tokens(tokenizer, "ok\n</think>\n\n您好<|im_end|>") == len(encode(tokenizer, "ok"))
    assert reasoning_tokens(tokenizer, "\n</think>\n\n您好<|im_end|>") == 0
    assert reasoning_tokens(tokenizer, "先查价格，再回复") == len(encode(tokenizer, "先查价格，再回复"))
