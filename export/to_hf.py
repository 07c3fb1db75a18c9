"""Export a hat-jax checkpoint to a Hugging Face folder that vLLM serves with MTP speculative decoding.

    python export/to_hf.py --ckpt runs/table6_both --out exports/hat_text            # an experiment: its last stage
    python export/to_hf.py --ckpt runs/stages/sft-hsa.rl-hsa-<key>/seed0 --out exports/hat_text
    python export/to_hf.py --ckpt runs/table3_hat --out exports/hat_dropin --layout dropin \
        --source /models/Qwen3.6-35B-A3B [--dtype bfloat16] [--seed 1] [--force]
    bash export/serve_vllm.sh exports/hat_dropin --mtp 3

`--ckpt`: a model checkpoint, a training run dir (its latest step), an experiment stage dir
`DIR/stages/<chain>-<key>/seed<k>` (refused while unfinished, i.e. without `stage_done.json`, unless
`--allow-unfinished`), or an experiment dir `DIR/<experiment>` (the last stage of its chain for `--seed`,
default the run's first seed). What was chosen is printed on stderr.
`--layout text` (default): `Qwen3_5MoeForCausalLM` (`model.*`, `lm_head.weight`, `mtp.*`; main experts
`--expert-layout fused|per_expert`). `--layout dropin`: the source's config.json and vision tower byte for
byte, its prefix and expert layouts; a source of another architecture is refused, naming the fields.
Always writes the MTP block, tokenizer files (from `<ckpt>/tokenizer/`, else the source),
`generation_config.json` with the paper's deployment sampling (do_sample, temperature 1.0, top_p 0.95)
plus eos/pad ids, and `hat_export.json` (source checkpoint, step, experiment/stage, export time, hat-jax
commit, `policy_version`). Prints one line per file written with its size; refuses a non-empty `--out`
without `--force`. Logic: `hat_jax.export.cli`.
"""

import sys

from hat_jax.export.cli import to_hf_main

if __name__ == "__main__":
    sys.exit(to_hf_main())
