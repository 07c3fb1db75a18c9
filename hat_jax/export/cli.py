"""The logic behind `export/from_hf.py` and `export/to_hf.py`: Hugging Face folder <-> our model checkpoint.

- `import_hf`: a `qwen3_5_moe` safetensors folder (text or VL layout, either expert layout, `mtp.*`
  included) -> a `hat_jax.model.checkpoint_io` checkpoint; tokenizer files go to `<out>/tokenizer/`.
  Tensors keep their on-disk dtypes unless a dtype is given.
- `--ckpt` is resolved by `hat_jax.export.sources.resolve_export_source` (a checkpoint, a training run dir,
  an experiment stage dir or an experiment dir).
- `export_hf`: that checkpoint -> a servable folder via `hf_io.save_hf_checkpoint`: text layout
  (`Qwen3_5MoeForCausalLM`) or the drop-in layout of a source folder (its config.json and vision tower
  kept byte for byte), MTP always, tokenizer files from `<ckpt>/tokenizer/` (else the source), a
  `generation_config.json` with the paper's deployment sampling (`DEPLOYMENT_SAMPLING`) plus the config's
  eos/pad ids, and the provenance file `hat_export.json` (`PROVENANCE_FILE`): the checkpoint exported, its
  step, experiment/stage/seed when known, layout and dtype, the export time, the hat-jax git commit, and
  `policy_version`, 12 hex digits of the SHA-256 of the written weight files and config.json (the same
  checkpoint exported with the same options always gets the same version; the deployment reports carry it),
  and `mtp_acceptance`: the MTP draft acceptance the experiment's evaluation measured on this very checkpoint
  (`hat_jax.export.sources.recorded_mtp_acceptance`; null, with `mtp_acceptance_reason`, when none was).
Both check everything they can before writing (the drop-in source's architecture is compared with the
checkpoint's model_config.json before the parameters are read), so a failure leaves no output behind.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

from hat_jax.cache import atomic_dir, write_text_atomic
from hat_jax.export.sources import ExportSource, recorded_mtp_acceptance, resolve_export_source
from hat_jax.model.checkpoint_io import load_model_checkpoint, save_model_checkpoint
from hat_jax.model.config import Qwen3_5MoeTextConfig
from hat_jax.model.hf_io import (INDEX_FILE, TOKENIZER_FILES, architecture_differences, load_hf_checkpoint,
                                 read_hf_config, save_hf_checkpoint)
from hat_jax.model.hf_mapping import CheckpointError

DEPLOYMENT_SAMPLING = {"do_sample": True, "temperature": 1.0, "top_p": 0.95}
TOKENIZER_SUBDIR = "tokenizer"
PROVENANCE_FILE = "hat_export.json"
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
    with atomic_dir(out_dir, clear_stale=True) as partial:
        save_model_checkpoint(partial, params, config)
        written = ["params", "model_config.json"]
        tokenizer = [n for n in TOKENIZER_FILES if (hf_dir / n).is_file()]
        if tokenizer:
            (partial / TOKENIZER_SUBDIR).mkdir()
            for name in tokenizer:
                shutil.copyfile(hf_dir / name, partial / TOKENIZER_SUBDIR / name)
            written += [f"{TOKENIZER_SUBDIR}/{n}" for n in tokenizer]
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


# --------------------------------------------------------------------------------------------------------
# Export
# --------------------------------------------------------------------------------------------------------
def policy_version(hf_dir: str | Path, names) -> str:
    """12 hex digits of the SHA-256 over the weight files and config.json among `names` (each file's name,
    size and bytes, in name order): identical for identical exported tensors and config."""
    digest = hashlib.sha256()
    for name in sorted(n for n in names if n.endswith(".safetensors") or n in (INDEX_FILE, "config.json")):
        path = Path(hf_dir) / name
        digest.update(f"{name}\0{path.stat().st_size}\0".encode())
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 24), b""):
                digest.update(block)
    return digest.hexdigest()[:12]


def _git_commit() -> tuple[str | None, bool | None]:
    """(commit, has uncommitted changes to tracked files) of the hat-jax checkout, or (None, None)."""
    repo = Path(__file__).resolve().parents[2]
    if not (repo / ".git").exists():
        return None, None
    try:
        commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None, None
    return commit or None, bool(dirty)


def provenance(source: ExportSource, out_dir: Path, written: list[str], *, layout: str, dropin_source: Path | None,
               dtype: str, expert_layout: str, tokenizer: Path | None,
               mtp_acceptance: tuple[dict | None, str | None]) -> dict:
    """The content of `hat_export.json` (module docstring); `policy_version` is a str. `mtp_acceptance`:
    `recorded_mtp_acceptance(source)`, read by the caller before anything is written."""
    commit, dirty = _git_commit()
    mtp, mtp_reason = mtp_acceptance
    return {
        "policy_version": policy_version(out_dir, written),
        "source_checkpoint": str(source.directory), "params_item": str(source.params_item), "step": source.step,
        "kind": source.kind, "requested": str(source.requested), "experiment": source.experiment,
        "stage": source.stage, "seed": source.seed, "stage_done": source.stage_record,
        "layout": layout, "dropin_source": str(dropin_source) if dropin_source else None, "dtype": dtype,
        "expert_layout": expert_layout if layout == "text" else None,
        "tokenizer": str(tokenizer) if tokenizer else None,
        "exported_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "hat_jax_commit": commit, "hat_jax_dirty": dirty,
        "mtp_acceptance": mtp, "mtp_acceptance_reason": mtp_reason,
    }


def check_dropin_source(config_path: Path, source: Path) -> None:
    """Raises CheckpointError naming every architecture field where the checkpoint's model config
    (`config_path`) and the drop-in source's config.json differ (ours vs source), or an unreadable source."""
    ours = read_hf_config(config_path)
    if not (Path(source) / "config.json").is_file():
        raise CheckpointError(f"--source {source}: no config.json (expected a Hugging Face qwen3_5_moe folder)")
    diffs = architecture_differences(ours, read_hf_config(Path(source) / "config.json"))
    if diffs:
        raise CheckpointError(f"the checkpoint's model config {config_path} does not match the drop-in source "
                              f"{source}/config.json; mismatched fields (checkpoint vs source): {'; '.join(diffs)}")


def export_hf(ckpt: str | Path | ExportSource, out_dir: str | Path, *, layout: str = "text",
              source: str | Path | None = None, dtype: str = "bfloat16", expert_layout: str = "fused",
              force: bool = False) -> list[str]:
    """Exports a checkpoint (anything `resolve_export_source` accepts, or its result) to a servable HF folder
    with `hat_export.json` (module docstring).

    Returns:
        One line per file written, with its size.
    Raises:
        FileExistsError: `out_dir` is not empty and not `force`. CheckpointError: a checkpoint without the
        MTP block, a bad layout or source, a drop-in source of another architecture (names the fields).
        FileNotFoundError / UnfinishedStageError / ValueError: see `resolve_export_source`; an unreadable
        checkpoint or results.json (`recorded_mtp_acceptance`, read before anything is written).
    """
    out_dir = Path(out_dir)
    if not force:
        _require_empty(out_dir, "; pass --force to overwrite it")
    if layout == "dropin" and source is None:
        raise CheckpointError("--layout dropin needs --source HF_BASE_DIR (its config.json and vision weights)")
    resolved = ckpt if isinstance(ckpt, ExportSource) else resolve_export_source(ckpt)
    if layout == "dropin":
        check_dropin_source(resolved.config_path, Path(source))   # before reading a 70 GB checkpoint
    mtp_acceptance = recorded_mtp_acceptance(resolved)            # an unreadable results.json: before writing
    config, params = load_model_checkpoint(resolved.directory, host=True)  # into host memory, no device copy
    if not config.mtp_num_hidden_layers:
        raise CheckpointError(f"{resolved.directory}: the checkpoint has no MTP block (mtp_num_hidden_layers=0); "
                              "the export always writes mtp.* for vLLM MTP speculative decoding")
    tokenizer_dir = resolved.directory / TOKENIZER_SUBDIR
    tokenizer_dir = tokenizer_dir if tokenizer_dir.is_dir() else None
    if force and (out_dir / PROVENANCE_FILE).is_file():
        (out_dir / PROVENANCE_FILE).unlink()   # never left describing the weights of an earlier export
    written = save_hf_checkpoint(
        params, config, out_dir, layout=layout, source=source, dtype=dtype, expert_layout=expert_layout,
        tokenizer_dir=tokenizer_dir, generation_config=deployment_generation_config(config), force=force)
    record = provenance(resolved, out_dir, written, layout=layout, dropin_source=Path(source) if source else None,
                        dtype=dtype, expert_layout=expert_layout,
                        tokenizer=tokenizer_dir or (Path(source) if source and any(
                            (Path(source) / n).is_file() for n in TOKENIZER_FILES) else None),
                        mtp_acceptance=mtp_acceptance)
    write_text_atomic(out_dir / PROVENANCE_FILE, json.dumps(record, indent=1, sort_keys=True) + "\n")
    return _file_lines(out_dir, written + [PROVENANCE_FILE])


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


def _export_cli(prog: str, args: argparse.Namespace) -> list[str]:
    """Resolves --ckpt, says on stderr what was chosen (and when the folder gets no tokenizer), exports."""
    resolved = resolve_export_source(args.ckpt, seed=args.seed, allow_unfinished=args.allow_unfinished)
    print(f"{prog}: exporting {resolved.describe()}", file=sys.stderr)
    has_tokenizer = (resolved.directory / TOKENIZER_SUBDIR).is_dir() or (
        args.source is not None and any((args.source / n).is_file() for n in TOKENIZER_FILES))
    if not has_tokenizer:
        print(f"{prog}: warning: {resolved.directory} has no {TOKENIZER_SUBDIR}/ folder and there is no --source "
              "tokenizer: the HF folder gets no tokenizer (vLLM and transformers serve need one)", file=sys.stderr)
    return export_hf(resolved, args.out, layout=args.layout, source=args.source, dtype=args.dtype,
                     expert_layout=args.expert_layout, force=args.force)


def to_hf_main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="export/to_hf.py", description="Export a hat-jax checkpoint (a model "
                                     "checkpoint, a training run dir, an experiment stage dir or an experiment dir) "
                                     "to a Hugging Face folder servable by vLLM with MTP.")
    parser.add_argument("--ckpt", type=Path, required=True,
                        help="model checkpoint, training run dir (latest step), experiment stage dir "
                             "DIR/stages/<chain>-<key>/seed<k>, or experiment dir DIR/<experiment> (its last stage)")
    parser.add_argument("--out", type=Path, required=True, help="output HF folder")
    parser.add_argument("--seed", type=int, help="with an experiment dir: which seed's last stage (default: the "
                        "run's first seed)")
    parser.add_argument("--allow-unfinished", action="store_true",
                        help="export a stage dir without stage_done.json (its latest checkpoint)")
    parser.add_argument("--layout", choices=("text", "dropin"), default="text",
                        help="text: Qwen3_5MoeForCausalLM; dropin: the layout and config.json of --source")
    parser.add_argument("--source", type=Path, help="HF base folder (needed by --layout dropin)")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--expert-layout", choices=("fused", "per_expert"), default="fused",
                        help="main-layer experts in the text layout (MTP experts are always per expert)")
    parser.add_argument("--force", action="store_true", help="write into a non-empty --out")
    a = parser.parse_args(argv)
    return _run(parser.prog, lambda: _export_cli(parser.prog, a), {})
