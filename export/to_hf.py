"""Export a hat-jax model checkpoint to a Hugging Face folder that vLLM serves with MTP speculative decoding.

    python export/to_hf.py --ckpt checkpoints/hat_rl --out exports/hat_text
    python export/to_hf.py --ckpt checkpoints/hat_rl --out exports/hat_dropin --layout dropin \
        --source /models/Qwen3.6-35B-A3B [--dtype bfloat16] [--force]
    vllm serve exports/hat_dropin --speculative-config '{"method":"mtp","num_speculative_tokens":3}'

`--layout text` (default): `Qwen3_5MoeForCausalLM` (`model.*`, `lm_head.weight`, `mtp.*`; main experts
`--expert-layout fused|per_expert`). `--layout dropin`: the source's config.json and vision tower byte for
byte, its prefix and expert layouts. Always writes the MTP block, tokenizer files (from
`<ckpt>/tokenizer/`, else the source) and `generation_config.json` with the paper's deployment sampling
(do_sample, temperature 1.0, top_p 0.95) plus eos/pad ids. Prints one line per file written with its
size; refuses a non-empty `--out` without `--force`. Logic: `hat_jax.export_cli.export_hf`.
"""

import sys

from hat_jax.export_cli import to_hf_main

if __name__ == "__main__":
    sys.exit(to_hf_main())
