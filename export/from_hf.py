"""Import a Hugging Face qwen3_5_moe folder (e.g. Qwen3.6-35B-A3B) into a hat-jax model checkpoint.

    python export/from_hf.py --hf /models/Qwen3.6-35B-A3B --out checkpoints/qwen3_6_base [--dtype float32]

Reads config.json + safetensors (text or VL layout, fused or per-expert experts, `mtp.*`; pickle weight
files are refused), writes `hat_jax.model.checkpoint_io.save_model_checkpoint(out, params, config)` and
copies the tokenizer files to `<out>/tokenizer/`. `--dtype keep` (default) keeps the on-disk dtypes.
Logic: `hat_jax.export.cli.import_hf`.
"""

import sys

from hat_jax.export.cli import from_hf_main

if __name__ == "__main__":
    sys.exit(from_hf_main())
