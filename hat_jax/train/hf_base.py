"""The real preset's base: a local Hugging Face `qwen3_5_moe` folder imported as a base checkpoint for --init
(`import_hf_base`; the tiny presets pretrain theirs, `hat_jax.train.pretrain`)."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import time
from pathlib import Path

from hat_jax.cache import atomic_dir
from hat_jax.model.checkpoint_io import save_model_checkpoint
from hat_jax.model.hf_io import TOKENIZER_FILES, load_hf_checkpoint, read_hf_config, stream_hf_params
from hat_jax.model.sharding import default_mesh
from hat_jax.tokenizer import load_tokenizer

log = logging.getLogger("hat_jax.train.pretrain")
IMPORT_REPORT = "import_report.json"


def import_hf_base(hf_path: str | Path, out_dir: str | Path) -> Path:
    """A local Hugging Face qwen3_5_moe folder -> a base checkpoint folder for --init.

    Output (written to a temporary sibling and renamed into place): `<out>/params` (Orbax) +
    `<out>/model_config.json` (`save_model_checkpoint`), `<out>/tokenizer/` (the folder's tokenizer files,
    copied byte for byte) and `<out>/import_report.json`. Parameters keep their on-disk dtypes (the stages
    cast to fp32 when they load them). With several devices they are streamed one tensor at a time into the
    default mesh's shardings and written shard by shard (`hat_jax.model.hf_io.stream_hf_params`; host RAM
    about one tensor, not the model). A folder that already holds a finished import is returned as it is.

    Raises:
        FileNotFoundError: hf_path is not a folder, or lacks config.json, *.safetensors weights or
            tokenizer.json (the message lists everything missing).
        FileExistsError: out_dir exists, is not empty and is not a finished import.
        CheckpointError (a ValueError): bad config.json or tensors (from `hat_jax.model.hf_io`).
        ValueError: the tokenizer has more tokens than the config's vocab_size.
    """
    src, out = Path(hf_path).resolve(), Path(out_dir).resolve()
    if not src.is_dir():
        what = "is not a folder" if src.exists() else "does not exist"
        raise FileNotFoundError(f"HF base folder {str(src)!r} {what}")
    missing = [what for what, ok in (
        ("config.json (the model config)", (src / "config.json").is_file()),
        ("*.safetensors weights (model.safetensors, or shards + model.safetensors.index.json)",
         any(src.glob("*.safetensors"))),
        ("tokenizer.json (the tokenizer)", (src / "tokenizer.json").is_file())) if not ok]
    if missing:
        raise FileNotFoundError(f"HF base folder {str(src)!r} lacks: " + "; ".join(missing))
    if (out / IMPORT_REPORT).is_file():
        log.info("HF base already imported at %s", out)
        return out
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{str(out)!r} exists and is not an empty folder or a finished import; choose another "
                              "out_dir")
    t0 = time.perf_counter()
    config = read_hf_config(src / "config.json")
    mesh = default_mesh(None, config.num_experts)
    if mesh is None:
        config, params, layout = load_hf_checkpoint(src)
    else:  # several devices: one tensor at a time into the mesh's shards; every process writes its own shards
        params, layout = stream_hf_params(src, config, mesh)
    with atomic_dir(out) as tmp:
        save_model_checkpoint(tmp, params, config)
        (tmp / "tokenizer").mkdir()
        copied = [name for name in TOKENIZER_FILES if (src / name).is_file()]
        for name in copied:
            shutil.copyfile(src / name, tmp / "tokenizer" / name)
        tokens = len(load_tokenizer(tmp / "tokenizer"))
        if tokens > config.vocab_size:
            raise ValueError(f"HF base folder {str(src)!r}: the tokenizer has {tokens} tokens, more than config.json's "
                             f"vocab_size {config.vocab_size}")
        report = {"source": str(src), "layout": dataclasses.asdict(layout), "vocab_size": config.vocab_size,
                  "tokenizer_tokens": tokens, "tokenizer_files": copied, "wall_s": round(time.perf_counter() - t0, 2)}
        (tmp / IMPORT_REPORT).write_text(json.dumps(report, indent=1) + "\n")
    log.info("imported HF base %s -> %s (%.0f s)", src, out, report["wall_s"])
    return out
