"""`export/serve_vllm.sh` and `export/check_vllm.py` without vLLM or a GPU: the scripts parse, refuse to run
where they cannot (exit 1 / 2 with one clear line), build the documented vllm command, and check_vllm's
comparison, table and exit status work end to end against a stand-in `vllm` module (a fake engine whose MTP
setting decodes faster and reports spec_decode counters); its pure summary puts hat-jax's offline acceptance (from
the folder's hat_export.json) beside vLLM's measured one."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVE, CHECK = ROOT / "export" / "serve_vllm.sh", ROOT / "export" / "check_vllm.py"

FAKE_VLLM = '''
import os, time
from types import SimpleNamespace
__version__ = "0.0-fake"
_COUNTS = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0}

class SamplingParams:
    def __init__(self, temperature, max_tokens, ignore_eos, detokenize):
        self.max_tokens = max_tokens

class LLM:
    def __init__(self, model, speculative_config=None, **kwargs):
        assert kwargs["disable_log_stats"] is False and kwargs["enable_prefix_caching"] is False
        self.k = (speculative_config or {}).get("num_speculative_tokens", 0)

    def generate(self, prompts, params, use_tqdm=False):
        time.sleep(0.005 * params.max_tokens / (2 if self.k else 1))
        if self.k:
            _COUNTS["num_drafts"] += params.max_tokens // 2
            _COUNTS["num_draft_tokens"] += self.k * (params.max_tokens // 2)
            _COUNTS["num_accepted_tokens"] += params.max_tokens // 2
        outs = []
        for p in prompts:
            ids = [(sum(p["prompt_token_ids"]) + 7 * i) % 500 for i in range(params.max_tokens)]
            if self.k and os.environ.get("FAKE_MTP_DIFFERS") and len(ids) > 3:
                ids[3] += 1
            outs.append(SimpleNamespace(outputs=[SimpleNamespace(token_ids=ids)]))
        return outs

    def get_metrics(self):
        return [SimpleNamespace(name=f"vllm:spec_decode_{k}", value=v) for k, v in _COUNTS.items()]
'''


OFFLINE = {"acceptance_depth1": 0.375, "mean_accepted_length": 1.375, "positions": 48, "episodes": 2, "seed": 0,
           "checkpoint": "/runs/stages/sft-hsa.rl-hsa-abcdef0123/seed0", "experiment": "table6_both",
           "results": "/runs/table6_both/results.json"}


def _check_module():
    spec = importlib.util.spec_from_file_location("check_vllm", CHECK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture()
def fake_bin(tmp_path):
    """A folder with an `nvidia-smi` that lists one GPU (`gpu/`) and one that fails (`nogpu/`)."""
    for name, body in (("gpu", 'echo "GPU 0: Fake H200 (UUID: GPU-0)"'), ("nogpu", "exit 9")):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "nvidia-smi").write_text(f"#!/bin/sh\n{body}\n")
        (folder / "nvidia-smi").chmod(0o755)
    return tmp_path


@pytest.fixture()
def hf_dir(tmp_path):
    folder = tmp_path / "hat_text"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["Qwen3_5MoeForCausalLM"], "vocab_size": 512}))
    (folder / "hat_export.json").write_text(json.dumps({"policy_version": "0123456789ab", "mtp_acceptance": OFFLINE,
                                                        "mtp_acceptance_reason": None}))
    return folder


def _env(path_first: Path, **extra) -> dict:
    return dict(os.environ, PATH=f"{path_first}{os.pathsep}{os.environ['PATH']}", **extra)


def test_serve_script_parses_refuses_without_gpu_and_builds_the_command(fake_bin, hf_dir, tmp_path):
    assert subprocess.run(["bash", "-n", str(SERVE)]).returncode == 0
    venv = tmp_path / "venv-never-made"
    env = _env(fake_bin / "nogpu", HAT_VLLM_VENV=str(venv))
    proc = subprocess.run(["bash", str(SERVE), str(hf_dir)], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 1 and "no NVIDIA GPU" in proc.stderr and "transformers serve" in proc.stderr
    assert not venv.exists()

    def dry(*args, folder=hf_dir):
        proc = subprocess.run(["bash", str(SERVE), str(folder), "--dry-run", *args], capture_output=True, text=True,
                              env=env, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.splitlines()[1]

    line = dry("--port", "8123", "--max-model-len", "4096")
    assert line.startswith(f"{venv}/bin/vllm serve {hf_dir} --port 8123 --served-model-name hat_text ")
    assert '--speculative-config \\{\\"method\\":\\"mtp\\"\\,\\"num_speculative_tokens\\":3\\}' in line
    assert line.rstrip().endswith("--max-model-len 4096") and "--language-model-only" not in line
    line = dry("--mtp", "0", "--served-model-name", "hat policy")
    assert "speculative" not in line and "--served-model-name hat\\ policy" in line
    vl = tmp_path / "dropin"
    vl.mkdir()
    (vl / "config.json").write_text(json.dumps({"architectures": ["Qwen3_5MoeForConditionalGeneration"],
                                               "vision_config": {"depth": 1}}))
    assert "--language-model-only" in dry(folder=vl)
    for bad, message in ((["--mtp", "x"], "--mtp expects a number"), ([], "has no config.json")):
        folder = str(hf_dir) if bad else str(tmp_path / "missing")
        proc = subprocess.run(["bash", str(SERVE), folder, *bad], capture_output=True, text=True, env=env, timeout=60)
        assert proc.returncode in (1, 2) and message in proc.stderr


def test_check_vllm_exits_2_where_it_cannot_run(fake_bin, hf_dir):
    proc = subprocess.run([sys.executable, str(CHECK), str(hf_dir)], capture_output=True, text=True, timeout=120,
                          env=_env(fake_bin / "nogpu"))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().count("\n") == 0 and "cannot run: no NVIDIA GPU" in proc.stderr
    proc = subprocess.run([sys.executable, str(CHECK), str(hf_dir)], capture_output=True, text=True, timeout=120,
                          env=_env(fake_bin / "gpu"))
    assert proc.returncode == 2 and "vllm is not importable by" in proc.stderr
    assert ".venv-vllm/bin/python" in proc.stderr


@pytest.mark.parametrize("differs", [False, True])
def test_check_vllm_compares_mtp_on_and_off(fake_bin, hf_dir, tmp_path, differs):
    (tmp_path / "fake").mkdir()
    (tmp_path / "fake" / "vllm.py").write_text(FAKE_VLLM)
    env = _env(fake_bin / "gpu", PYTHONPATH=str(tmp_path / "fake"), **({"FAKE_MTP_DIFFERS": "1"} if differs else {}))
    out = tmp_path / "check.json"
    proc = subprocess.run([sys.executable, str(CHECK), str(hf_dir), "--skip-tokenizer-init", "--max-new-tokens", "20",
                           "--repeats", "1", "--out", str(out)], capture_output=True, text=True, timeout=120, env=env)
    assert out.is_file(), proc.stderr
    summary = json.loads(out.read_text())
    assert proc.returncode == (1 if differs else 0), proc.stderr
    assert "| 1 |" in proc.stdout and "| 2 |" in proc.stdout and "accepted draft tokens:" in proc.stdout
    assert summary["greedy_identical"] is not differs and summary["policy_version"] == "0123456789ab"
    if differs:
        assert summary["differing_prompts"] == [0, 1, 2, 3] and summary["first_difference"]["0"] == 3
    assert summary["accepted_tokens"] > 0 and summary["acceptance_rate"] == pytest.approx(1 / 3, abs=1e-3)
    assert summary["mtp_on"]["timing"]["c2"]["decode_tok_s_total"] == pytest.approx(
        2 * summary["mtp_on"]["timing"]["c2"]["decode_tok_s_per_request"], rel=1e-3)
    assert summary["speedup"]["c1"] > 1.2                     # the fake decodes twice as fast with MTP
    assert summary["acceptance"] == {
        "num_speculative_tokens": 3, "comparable": False, "vllm_acceptance_rate": summary["acceptance_rate"],
        "vllm_mean_acceptance_length": 2.0, "hat_jax_acceptance_depth1": 0.375, "hat_jax_mean_accepted_length": 1.375,
        "hat_jax_positions": 48, "hat_jax_source": "/runs/table6_both/results.json", "hat_jax_reason": None}
    assert "| per draft token | 0.3750 | 0.3333 |" in proc.stdout


def _setting(mtp: int, tok_s: tuple[float, float], outputs, counts=(0.0, 0.0, 0.0)) -> dict:
    timing = {c: {"decode_s": [1.0], "decode_tok_s_per_request": v, "decode_tok_s_total": v * int(c[1])}
              for c, v in zip(("c1", "c2"), tok_s)}
    return {"mtp": mtp, "outputs": outputs, "timing": timing,
            "spec_decode": dict(zip(("num_drafts", "num_draft_tokens", "num_accepted_tokens"), counts))}


def test_summary_puts_offline_and_vllm_acceptance_side_by_side():
    check = _check_module()
    off = _setting(0, (100.0, 80.0), [[1, 2, 3], [4, 5, 6]])
    on = _setting(1, (150.0, 100.0), [[1, 2, 3], [4, 5, 6]], counts=(40.0, 40.0, 30.0))
    summary = check.summarize(off, on)
    # one speculative token: rate = 30 / 40 draft tokens = 0.75, mean length 1 + 30 / 40 drafts = 1.75
    assert (summary["acceptance_rate"], summary["mean_acceptance_length"]) == (0.75, 1.75)
    assert summary["speedup"] == {"c1": 1.5, "c2": 1.25} and summary["greedy_identical"]
    side = check.acceptance_side_by_side(summary, {"mtp_acceptance": OFFLINE}, 1)
    assert side == {"num_speculative_tokens": 1, "comparable": True, "vllm_acceptance_rate": 0.75,
                    "vllm_mean_acceptance_length": 1.75, "hat_jax_acceptance_depth1": 0.375,
                    "hat_jax_mean_accepted_length": 1.375, "hat_jax_positions": 48,
                    "hat_jax_source": "/runs/table6_both/results.json", "hat_jax_reason": None}
    text = check.table(dict(summary, acceptance=side), 1)
    assert "| acceptance | hat-jax offline (teacher-forced, depth 1) | vLLM measured (MTP 1) |" in text
    assert "| per draft token | 0.3750 | 0.7500 |" in text
    assert "| mean accepted length | 1.3750 (1 speculative token) | 1.750 (1 speculative token) |" in text
    assert "hat-jax offline acceptance: 48 positions, from /runs/table6_both/results.json" in text
    assert "averages over draft depths" not in text
    # three speculative tokens: 30 accepted of 120 draft tokens in 40 drafts; not the depth-1 figure
    summary = check.summarize(off, _setting(3, (150.0, 100.0), off["outputs"], counts=(40.0, 120.0, 30.0)))
    assert (summary["acceptance_rate"], summary["mean_acceptance_length"]) == (0.25, 1.75)
    side = check.acceptance_side_by_side(summary, {"mtp_acceptance": None,
                                                   "mtp_acceptance_reason": "the exported source is a model checkpoint"}, 3)
    assert side["hat_jax_acceptance_depth1"] is None and side["comparable"] is False
    text = check.table(dict(summary, acceptance=side), 3)
    assert "| per draft token | n/a | 0.2500 |" in text and "(3 speculative tokens) |" in text
    assert "hat-jax offline acceptance: none (the exported source is a model checkpoint)" in text
    assert "averages over draft depths 1..3" in text and "--mtp 1" in text
    assert check.offline_acceptance(None) == (None, "the folder has no hat_export.json")
    assert "predates the mtp_acceptance field" in check.offline_acceptance({"policy_version": "x"})[1]
    no_drafts = check.summarize(off, _setting(1, (150.0, 100.0), off["outputs"]))
    assert check.acceptance_side_by_side(no_drafts, None, 1)["vllm_acceptance_rate"] is None
