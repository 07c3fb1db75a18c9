"""Export + reload in transformers gives the greedy tokens of `python -m hat_jax.generate` in fp32, at the command
line: `export/to_hf.py --ckpt EXPERIMENT_DIR --dtype float32`, `python -m hat_jax.generate --ckpt STAGE_DIR`,
`AutoModelForCausalLM.from_pretrained(HF_DIR).generate(do_sample=False)`; and `export/greedy_parity.py`, which
measures the same on any run dir, reports identical tokens (exit 0) or bad input (exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
import transformers
from export_helpers import RL

ROOT = Path(__file__).resolve().parents[2]
NEW_TOKENS = 16


def _load_script(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "export" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_transformers_greedy_matches_generate_cli(runs, tmp_path):
    hf = tmp_path / "hf"
    proc = subprocess.run([sys.executable, str(ROOT / "export" / "to_hf.py"), "--ckpt", str(runs / "table6_both"),
                           "--out", str(hf), "--dtype", "float32"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    tok = transformers.AutoTokenizer.from_pretrained(str(hf), local_files_only=True)
    chat = tok.apply_chat_template([{"role": "user", "content": "这款口红多少钱？"}], tokenize=False,
                                   add_generation_prompt=True)
    ids = tok(chat, add_special_tokens=False)["input_ids"]

    proc = subprocess.run([sys.executable, "-m", "hat_jax.generate", "--ckpt", str(runs / "stages" / RL / "seed0"),
                           "--prompt-ids", ",".join(map(str, ids)), "--max-new-tokens", str(NEW_TOKENS)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    ours = json.loads(proc.stdout)["ids"]

    torch.set_num_threads(2)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(hf), dtype=torch.float32).eval()
    x = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, temperature=None, top_p=None,
                             max_new_tokens=NEW_TOKENS, eos_token_id=model.config.eos_token_id,
                             pad_token_id=model.config.pad_token_id)
    theirs = out[0, len(ids):].tolist()
    assert len(ours) == NEW_TOKENS and len(set(ours)) > 2       # a real continuation, not one repeated token
    assert ours == theirs


def test_greedy_parity_script(runs, tmp_path, capsys):
    parity = _load_script("greedy_parity")
    out = tmp_path / "parity.json"
    rc = parity.main(["--ckpt", str(runs / "table6_both"), "--prompt", "有优惠吗？", "--max-new-tokens", "6",
                      "--out", str(out)])
    summary = json.loads(out.read_text())
    assert rc == 0 and summary["identical"] and len(summary["prompts"]) == 1
    assert summary["prompts"][0]["ours"] == summary["prompts"][0]["hf"] and len(summary["prompts"][0]["ours"]) == 6
    assert summary["export"]["dtype"] == "float32" and summary["export"]["stage"] == RL
    assert parity.main(["--ckpt", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
