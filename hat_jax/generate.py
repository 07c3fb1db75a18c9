"""Generate a continuation of one prompt from a checkpoint; prints exactly one JSON line on stdout.

    python -m hat_jax.generate --ckpt runs/micro/ckpt --prompt-ids 11,12,13 --max-new-tokens 16
    python -m hat_jax.generate --hf /models/Qwen3.6-35B-A3B --prompt "def fib(n):" --max-new-tokens 64 \
        --temperature 0.7 --top-p 0.95 --dtype bfloat16

Output: `{"ids": [...], "text": "..."}` where `ids` are the generated tokens (the stop token included when
one was produced) and `text` is `tokenizer.decode(ids)` with special tokens kept (omitted when the
checkpoint has no tokenizer). Logs go to stderr.

- `--hf DIR`: a Hugging Face checkpoint folder, read by `hat_jax.model.hf_io.load_hf_checkpoint`; its
  tokenizer is the folder itself. `--ckpt DIR`: a `hat_jax.model.checkpoint_io` checkpoint or Orbax
  CheckpointManager root; its tokenizer is `DIR/tokenizer` when present.
- `--prompt TEXT` is tokenized as raw text (`tokenizer(text)`, no chat template: this is a completion
  tool; apply the chat template yourself and pass ids to chat). `--prompt-ids 1,2,3` needs no tokenizer.
- Stop ids: the config's `eos_token_id` (all of them when the config.json had a list). Greedy unless
  `--temperature` > 0.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import sys
import time
from pathlib import Path

log = logging.getLogger("hat_jax.generate")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m hat_jax.generate", description=__doc__.split("\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--hf", type=Path, help="Hugging Face checkpoint folder")
    source.add_argument("--ckpt", type=Path, help="hat-jax Orbax checkpoint folder or CheckpointManager root")
    prompt = parser.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="raw prompt text (needs a tokenizer)")
    prompt.add_argument("--prompt-ids", help="comma-separated token ids, e.g. 1,2,3")
    parser.add_argument("--max-new-tokens", type=int, required=True)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-p", type=float, default=1.0, help="1.0 = off (default)")
    parser.add_argument("--top-k", type=int, default=0, help="0 = off (default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="compute dtype")
    return parser.parse_args(argv)


def tokenizer_dir(args: argparse.Namespace) -> Path | None:
    """The tokenizer folder of the chosen checkpoint, or None when it has none."""
    folder = args.hf if args.hf is not None else args.ckpt / "tokenizer"
    return folder if any((folder / name).is_file() for name in TOKENIZER_FILES) else None


def parse_prompt_ids(text: str) -> list[int]:
    """'1, 2,3' -> [1, 2, 3]. Raises ValueError on a non-integer, a negative id or an empty list."""
    try:
        ids = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as err:
        raise ValueError(f"--prompt-ids {text!r}: expected comma-separated integers") from err
    if not ids or min(ids) < 0:
        raise ValueError(f"--prompt-ids {text!r}: expected at least one non-negative token id")
    return ids


def stop_token_ids(config) -> tuple[int, ...]:
    """The config's eos ids (all of them when config.json has a list)."""
    return tuple(int(i) for i in config.eos_token_ids)


def load_model(args: argparse.Namespace):
    """Returns (config, params) from --hf or --ckpt."""
    if args.hf is not None:
        try:  # lazily: the HF reader is only needed for --hf
            from hat_jax.model.hf_io import load_hf_checkpoint
        except ModuleNotFoundError as err:
            if err.name != "hat_jax.model.hf_io":
                raise
            raise NotImplementedError("--hf needs hat_jax.model.hf_io, which this tree does not have") from err
        config, params, _ = load_hf_checkpoint(args.hf)
        return config, params
    from hat_jax.model.checkpoint_io import load_model_checkpoint

    return load_model_checkpoint(args.ckpt)


def run(args: argparse.Namespace) -> dict:
    """Loads the model (and tokenizer), generates, returns the JSON-able output dict.

    Raises:
        ValueError / OSError: bad arguments, `--prompt` without a tokenizer, unreadable checkpoint or tokenizer.
        NotImplementedError: --hf while `hat_jax.model.hf_io` is absent.
    """
    import jax
    import jax.numpy as jnp

    from hat_jax.model.sampler import generate, left_pad
    from hat_jax.model.sampling import SamplingConfig

    sampling = SamplingConfig(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                              max_new_tokens=args.max_new_tokens)  # fail fast; stop and pad ids come later
    model_dir = args.hf if args.hf is not None else args.ckpt
    if not Path(model_dir).is_dir():
        raise FileNotFoundError(f"{'--hf' if args.hf is not None else '--ckpt'} '{model_dir}' does not exist "
                                "(expected a checkpoint folder)")
    tok_dir = tokenizer_dir(args)
    if args.prompt is not None and tok_dir is None:
        where = args.hf if args.hf is not None else args.ckpt / "tokenizer"
        raise ValueError(f"--prompt needs a tokenizer, but {where} has none of {', '.join(TOKENIZER_FILES)}; "
                         "pass --prompt-ids instead")
    tokenizer = None
    if tok_dir is not None:
        from hat_jax.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(tok_dir)
        log.info("tokenizer: %s", tok_dir)
    ids = tokenizer(args.prompt)["input_ids"] if args.prompt is not None else parse_prompt_ids(args.prompt_ids)
    if not ids:
        raise ValueError(f"--prompt {args.prompt!r} tokenized to no tokens")
    start = time.time()
    config, params = load_model(args)
    log.info("loaded %s in %.1fs", args.hf or args.ckpt, time.time() - start)
    if max(ids) >= config.vocab_size:
        raise ValueError(f"prompt id {max(ids)} is >= the model's vocab_size {config.vocab_size}")
    sampling = dataclasses.replace(sampling, stop_token_ids=stop_token_ids(config),
                                   pad_token_id=config.pad_token_id or 0)
    prompt_ids, prompt_mask = left_pad([ids], pad_id=sampling.pad_token_id)
    start = time.time()
    result = generate(params, config, prompt_ids, prompt_mask, jax.random.key(args.seed), sampling,
                      dtype=jnp.dtype(args.dtype))
    new_ids = [int(t) for t in result.tokens[0, : int(result.lengths[0])]]
    log.info("generated %d tokens (finished=%s) in %.1fs", len(new_ids), bool(result.finished[0]),
             time.time() - start)
    out = {"ids": new_ids}
    if tokenizer is not None:
        out["text"] = tokenizer.decode(new_ids, skip_special_tokens=False)
    return out


def main(argv=None) -> int:
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    log.setLevel(logging.INFO)
    logging.getLogger("hat_jax.checkpoints").setLevel(logging.INFO)  # which step was loaded, damaged steps
    args = parse_args(argv)
    try:
        with contextlib.redirect_stdout(sys.stderr):  # stdout carries only the JSON line
            out = run(args)
    except (OSError, ValueError, NotImplementedError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(json.dumps(out, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
