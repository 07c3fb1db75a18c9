"""Greedy parity of an export: `python -m hat_jax.generate` on the checkpoint vs `transformers` on its fp32 export.

    python export/greedy_parity.py --ckpt runs/table6_both [--seed 0] [--max-new-tokens 32] [--out parity.json]
    python export/greedy_parity.py --ckpt runs/stages/sft-hsa-<key>/seed0 --prompt "这款口红多少钱？"

`--ckpt` takes whatever `export/to_hf.py --ckpt` takes (checkpoint, run dir, stage dir, experiment dir).
The checkpoint is exported in the text layout with `--dtype float32` into a temporary folder (`--hf-out DIR`
keeps it), then, for every prompt, the greedy continuation of `hat_jax.generate` (its `run`, the code behind
`python -m hat_jax.generate --ckpt DIR --prompt-ids ...`, fp32 compute) is compared token for token with
`AutoModelForCausalLM.from_pretrained(HF_DIR, dtype=float32).generate(do_sample=False)` (both stop at the
config's eos ids). Prompts are chat-templated viewer questions (`--prompt`, repeatable; the checkpoint's
tokenizer through `AutoTokenizer` on the exported folder, so the export's tokenizer and chat template are
exercised too) or, for a checkpoint without a tokenizer, fixed token ids.

Prints one line per prompt and a JSON summary {"identical": bool, "prompts": [{"prompt_ids", "ours", "hf",
"first_difference"}], "export": hat_export.json}; `--out` writes the summary. Exit status 0 when every prompt
gives identical tokens, 1 when one differs, 2 on bad input (the message names it). CPU is enough.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

DEFAULT_PROMPTS = ("这款口红多少钱？", "有没有适合油皮的粉底液？推荐一下",
                   "今天直播间有什么优惠活动？")


def _prompt_ids(hf_dir: Path, prompts: list[str]) -> list[list[int]]:
    """Chat-templated prompts through the exported folder's tokenizer, or fixed ids when it has none."""
    if not (hf_dir / "tokenizer.json").is_file() and not (hf_dir / "tokenizer_config.json").is_file():
        return [[11, 12, 13, 14, 15], [20, 21, 22, 23, 24, 25, 26, 27]]
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(hf_dir), local_files_only=True)
    out = []
    for text in prompts:
        chat = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
        out.append(list(tokenizer(chat, add_special_tokens=False)["input_ids"]))
    return out


def _ours(ckpt_dir: Path, ids: list[int], max_new_tokens: int) -> list[int]:
    from hat_jax import generate

    args = generate.parse_args(["--ckpt", str(ckpt_dir), "--prompt-ids", ",".join(map(str, ids)),
                                "--max-new-tokens", str(max_new_tokens), "--dtype", "float32"])
    return generate.run(args)["ids"]


def _hf(model, ids: list[int], max_new_tokens: int, eos: list[int], pad: int) -> list[int]:
    import torch

    x = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, temperature=None, top_p=None,
                             top_k=None, max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=pad)
    return [int(t) for t in out[0, len(ids):]]


def _first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def measure(ckpt, hf_dir: Path, prompts: list[str], max_new_tokens: int, seed: int | None = None,
            allow_unfinished: bool = False) -> dict:
    """Exports `ckpt` (fp32, text layout) to `hf_dir` and compares greedy tokens (module docstring)."""
    import torch
    import transformers

    from hat_jax.export.cli import PROVENANCE_FILE, export_hf
    from hat_jax.export.sources import resolve_export_source

    source = resolve_export_source(ckpt, seed=seed, allow_unfinished=allow_unfinished)
    print(f"greedy_parity: {source.describe()}", file=sys.stderr)
    export_hf(source, hf_dir, dtype="float32")
    torch.set_num_threads(2)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    eos = model.config.eos_token_id
    eos = list(eos) if isinstance(eos, (list, tuple)) else [eos]
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    rows = []
    for ids in _prompt_ids(hf_dir, prompts):
        ours, hf = _ours(source.directory, ids, max_new_tokens), _hf(model, ids, max_new_tokens, eos, pad)
        rows.append({"prompt_ids": ids, "ours": ours, "hf": hf, "first_difference": _first_difference(ours, hf)})
        same = "identical" if ours == hf else f"DIFFERENT from token {rows[-1]['first_difference']}"
        print(f"prompt of {len(ids)} tokens: {len(ours)} generated, {same}", file=sys.stderr)
    provenance = json.loads((hf_dir / PROVENANCE_FILE).read_text())
    return {"identical": all(r["ours"] == r["hf"] for r in rows), "max_new_tokens": max_new_tokens,
            "prompts": rows, "export": provenance}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="export/greedy_parity.py", description=__doc__.split("\n")[0])
    parser.add_argument("--ckpt", type=Path, required=True, help="anything export/to_hf.py --ckpt accepts")
    parser.add_argument("--seed", type=int, help="with an experiment dir: which seed (default: its first)")
    parser.add_argument("--allow-unfinished", action="store_true", help="accept a stage dir without stage_done.json")
    parser.add_argument("--prompt", action="append", help="a viewer question (repeatable; default: three built in)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--hf-out", type=Path, help="keep the fp32 export here (default: a temporary folder)")
    parser.add_argument("--out", type=Path, help="write the JSON summary here")
    a = parser.parse_args(argv)
    from hat_jax.model.hf_mapping import CheckpointError

    try:
        with tempfile.TemporaryDirectory(prefix="greedy_parity_") as tmp:
            hf_dir = a.hf_out if a.hf_out is not None else Path(tmp) / "hf"
            summary = measure(a.ckpt, hf_dir, a.prompt or list(DEFAULT_PROMPTS), a.max_new_tokens, a.seed,
                              a.allow_unfinished)
    except (CheckpointError, FileExistsError, FileNotFoundError, ValueError) as err:
        print(f"{parser.prog}: error: {err}", file=sys.stderr)
        return 2
    text = json.dumps(summary, ensure_ascii=False)
    if a.out is not None:
        a.out.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0 if summary["identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
