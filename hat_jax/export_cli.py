"""The logic behind `export/from_hf.py` and `export/to_hf.py`: Hugging Face folder <-> our model checkpoint.

- `import_hf`: a `qwen3_5_moe` safetensors folder (text or VL layout, either expert layout, `mtp.*`
  included) -> a `hat_jax.model.checkpoint_io` checkpoint; tokenizer files go to `<out>/tokenizer/`.
  Tensors keep their on-disk dtypes unless a dtype is given.
- `export_hf`: our checkpoint -> a servable folder via `hf_io.save_hf_checkpoint`: text layout
  (`Qwen3_5MoeForCausalLM`) or the drop-in layout of a source folder (its config.json and vision tower
  kept byte for byte), MTP always, tokenizer files from `<ckpt>/tokenizer/` (else the source), and a
  `generation_config.json` with the paper's deployment sampling (`DEPLOYMENT_SAMPLING`) plus the
  config's eos/pad ids.
Both check everything they can before writing, so a failure leaves no output behind.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

from hat_jax.model.checkpoint_io import load_model_checkpoint, save_model_checkpoint
from hat_jax.model.config import Qwen3_5MoeTextConfig
from hat_jax.model.hf_io import TOKENIZER_FILES, CheckpointError, load_hf_checkpoint, save_hf_checkpoint

DEPLOYMENT_SAMPLING = {"do_sample": True, "temperature": 1.0, "top_p": 0.95}
TOKENIZER_SUBDIR = "tokenizer"


def _require_empty(out: Path, hint: str = "") -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists and is not an empty directory{hint}")


def _file_lines(root: Path, names) -> list[str]:
    """'PATH  SIZE bytes' per written file (a folder's size is the sum of its files)."""
    return [f"{root / name}  {_size(root / name):,} bytes" for name in names]


def import_hf(hf_dir: str | Path, out_dir: str | Path, dtype: str | None = None) -> list[str]:
    """Imports a HF folder into a model checkpoint at `out_dir` (which must be new or empty).

    Args:
        dtype: None keeps each tensor's on-disk dtype; 'float32' or 'bfloat16' casts every parameter.
    Returns:
        One line per file or folder written, with its size.
    Raises:
        FileExistsError: `out_dir` is not empty. CheckpointError: a bad HF folder (nothing is written).
    """
    hf_dir, out_dir = Path(hf_dir).resolve(), Path(out_dir).resolve()
    _require_empty(out_dir, "; choose a new checkpoint directory")
    config, params, _ = load_hf_checkpoint(hf_dir)
    cast = (lambda x: jnp.asarray(x)) if dtype is None else (lambda x: jnp.asarray(x, jnp.dtype(dtype)))
    params = jax.tree_util.tree_map(cast, params)
    # Written into a sibling partial folder, renamed into place when complete (a killed import leaves no
    # half checkpoint at `out_dir`; the next import into the same place removes the partial folder).
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    partial = out_dir.parent / f".{out_dir.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    save_model_checkpoint(partial, params, config)
    written = ["params", "model_config.json"]
    tokenizer = [n for n in TOKENIZER_FILES if (hf_dir / n).is_file()]
    if tokenizer:
        (partial / TOKENIZER_SUBDIR).mkdir()
        for name in tokenizer:
            shutil.copyfile(hf_dir / name, partial / TOKENIZER_SUBDIR / name)
        written += [f"{TOKENIZER_SUBDIR}/{n}" for n in tokenizer]
    if out_dir.exists():
        out_dir.rmdir()  # empty (checked above)
    os.replace(partial, out_dir)
    return _file_lines(out_dir, written)


def deployment_generation_config(config: Qwen3_5MoeTextConfig) -> dict:
    """`generation_config.json`: the paper's deployment sampling plus the config's bos/eos/pad ids (eos as
    a list when the config has several)."""
    gen = dict(DEPLOYMENT_SAMPLING)
    eos = list(config.eos_token_id) if isinstance(config.eos_token_id, (tuple, list)) else config.eos_token_id
    for key, value in (("bos_token_id", config.bos_token_id), ("eos_token_id", eos),
                       ("pad_token_id", config.pad_token_id)):
        if value is not None:
            gen[key] = value
    return gen


def export_hf(ckpt_dir: str | Path, out_dir: str | Path, *, layout: str = "text", source: str | Path | None = None,
              dtype: str = "bfloat16", expert_layout: str = "fused", force: bool = False) -> list[str]:
    """Exports a model checkpoint to a servable HF folder (see the module docstring).

    Returns:
        One line per file written, with its size.
    Raises:
        FileExistsError: `out_dir` is not empty and not `force`. CheckpointError: a checkpoint without the
        MTP block, a bad layout or source. FileNotFoundError / ValueError: an unreadable checkpoint.
    """
    ckpt_dir, out_dir = Path(ckpt_dir), Path(out_dir)
    if not force:
        _require_empty(out_dir, "; pass --force to overwrite it")
    if layout == "dropin" and source is None:
        raise CheckpointError("--layout dropin needs --source HF_BASE_DIR (its config.json and vision weights)")
    config, params = load_model_checkpoint(ckpt_dir)
    if not config.mtp_num_hidden_layers:
        raise CheckpointError(f"{ckpt_dir}: the checkpoint has no MTP block (mtp_num_hidden_layers=0); the export "
                              "always writes mtp.* for vLLM MTP speculative decoding")
    tokenizer_dir = ckpt_dir / TOKENIZER_SUBDIR
    written = save_hf_checkpoint(
        params, config, out_dir, layout=layout, source=source, dtype=dtype, expert_layout=expert_layout,
        tokenizer_dir=tokenizer_dir if tokenizer_dir.is_dir() else None,
        generation_config=deployment_generation_config(config), force=force)
    return _file_lines(out_dir, written)


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


# --------------------------------------------------------------------------------------------------------
# Command lines
# --------------------------------------------------------------------------------------------------------
def _run(prog: str, fn, args: dict) -> int:
    try:
        lines = fn(**args)
    except (CheckpointError, FileExistsError, FileNotFoundError, ValueError) as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


def from_hf_main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="export/from_hf.py", description="Import a Hugging Face qwen3_5_moe "
                                     "safetensors folder into a hat-jax model checkpoint.")
    parser.add_argument("--hf", type=Path, required=True, help="HF folder: config.json + *.safetensors")
    parser.add_argument("--out", type=Path, required=True, help="new checkpoint directory")
    parser.add_argument("--dtype", choices=("keep", "float32", "bfloat16"), default="keep",
                        help="parameter dtype (default: keep each tensor's on-disk dtype)")
    a = parser.parse_args(argv)
    return _run(parser.prog, import_hf, dict(hf_dir=a.hf, out_dir=a.out, dtype=None if a.dtype == "keep" else a.dtype))


def to_hf_main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="export/to_hf.py", description="Export a hat-jax model checkpoint to "
                                     "a Hugging Face folder servable by vLLM with MTP.")
    parser.add_argument("--ckpt", type=Path, required=True, help="checkpoint directory (checkpoint_io)")
    parser.add_argument("--out", type=Path, required=True, help="output HF folder")
    parser.add_argument("--layout", choices=("text", "dropin"), default="text",
                        help="text: Qwen3_5MoeForCausalLM; dropin: the layout and config.json of --source")
    parser.add_argument("--source", type=Path, help="HF base folder (needed by --layout dropin)")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--expert-layout", choices=("fused", "per_expert"), default="fused",
                        help="main-layer experts in the text layout (MTP experts are always per expert)")
    parser.add_argument("--force", action="store_true", help="write into a non-empty --out")
    a = parser.parse_args(argv)
    return _run(parser.prog, export_hf, dict(ckpt_dir=a.ckpt, out_dir=a.out, layout=a.layout, source=a.source,
                                             dtype=a.dtype, expert_layout=a.expert_layout, force=a.force))
