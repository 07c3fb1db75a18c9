"""Hugging Face export and import of our checkpoints: `sources` resolves what `--ckpt` names (a checkpoint, a
stage run, an experiment) to one checkpoint step; `cli` writes the safetensors folder with its provenance
(`export/to_hf.py`, `export/from_hf.py` run it)."""
