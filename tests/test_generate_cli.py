"""`python -m hat_jax.generate` end to end on a saved micro checkpoint, and `checkpoint_io` layouts."""

import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from hat_jax.model import get_config, init_params
from hat_jax.model.checkpoint_io import load_model_checkpoint, save_model_checkpoint
from hat_jax.model.sampler import generate, left_pad
from hat_jax.model.sampling import SamplingConfig

PROMPT = "hello world, hello tokens"
MAX_NEW = 6


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """(config, params, checkpoint dir without tokenizer, checkpoint dir with tokenizer, tokenizer)."""
    from hat_jax.tokenizer import train_bpe_tokenizer

    config = get_config("micro")
    params = init_params(config, jax.random.key(0))
    plain = save_model_checkpoint(tmp_path_factory.mktemp("ckpt") / "plain", params, config)
    with_tok = tmp_path_factory.mktemp("ckpt") / "with_tokenizer"
    shutil.copytree(plain, with_tok)
    tokenizer = train_bpe_tokenizer([PROMPT, "hello again, world"] * 4, 300, with_tok / "tokenizer")
    return config, params, plain, with_tok, tokenizer


def run_cli(*args):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, "-m", "hat_jax.generate", *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=300)


def expected_ids(config, params, ids):
    sampling = SamplingConfig(max_new_tokens=MAX_NEW, stop_token_ids=(config.eos_token_id,),
                              pad_token_id=config.pad_token_id)
    result = generate(params, config, *left_pad([ids]), jax.random.key(0), sampling)
    return np.asarray(result.tokens[0, : int(result.lengths[0])]).tolist()


def test_cli_prompt_ids_matches_generate(model):
    config, params, plain, _, tokenizer = model
    ids = tokenizer(PROMPT)["input_ids"]
    proc = run_cli("--ckpt", plain, "--prompt-ids", ",".join(map(str, ids)), "--max-new-tokens", MAX_NEW)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout
    out = json.loads(lines[0])
    assert set(out) == {"ids"}  # no tokenizer in this checkpoint: no "text"
    assert out["ids"] == expected_ids(config, params, ids)


def test_cli_prompt_text_with_tokenizer(model):
    config, params, _, with_tok, tokenizer = model
    proc = run_cli("--ckpt", with_tok, "--prompt", PROMPT, "--max-new-tokens", MAX_NEW)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["ids"] == expected_ids(config, params, tokenizer(PROMPT)["input_ids"])  # same compilation as above
    assert out["text"] == tokenizer.decode(out["ids"], skip_special_tokens=False)


@pytest.mark.parametrize("case", ["missing_dir", "missing_hf_dir", "prompt_without_tokenizer"])
def test_cli_errors_exit_nonzero_with_message(model, tmp_path, case):
    _, _, plain, _, _ = model
    if case == "missing_dir":
        proc = run_cli("--ckpt", tmp_path / "nope", "--prompt-ids", "1,2", "--max-new-tokens", 2)
        expected = f"{tmp_path / 'nope'}' does not exist"
    elif case == "missing_hf_dir":
        proc = run_cli("--hf", tmp_path / "nope", "--prompt", "hi", "--max-new-tokens", 2)
        expected = f"--hf '{tmp_path / 'nope'}' does not exist"
    else:
        proc = run_cli("--ckpt", plain, "--prompt", "hi", "--max-new-tokens", 2)
        expected = "--prompt needs a tokenizer"
    assert proc.returncode != 0
    assert proc.stdout == ""
    assert expected in proc.stderr, proc.stderr


def test_cli_hf_folder(model, tmp_path):
    hf_io = pytest.importorskip("hat_jax.model.hf_io", reason="hat_jax.model.hf_io is written by another engineer")
    config, params, _, with_tok, tokenizer = model
    hf_dir = tmp_path / "hf"
    hf_io.save_hf_checkpoint(params, config, hf_dir, tokenizer_dir=with_tok / "tokenizer")
    proc = run_cli("--hf", hf_dir, "--prompt", PROMPT, "--max-new-tokens", MAX_NEW)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["ids"] == expected_ids(config, params, tokenizer(PROMPT)["input_ids"])
    assert out["text"] == tokenizer.decode(out["ids"], skip_special_tokens=False)


def test_checkpoint_round_trip_and_manager_root(model, tmp_path):
    config, params, plain, _, _ = model
    loaded_config, loaded = load_model_checkpoint(plain)
    assert loaded_config == config
    jax.tree_util.tree_map(np.testing.assert_array_equal, loaded, params)
    # A CheckpointManager root with an item named 'params' (the trainer's layout); the latest step wins.
    root = tmp_path / "run"
    with ocp.CheckpointManager(root) as manager:
        for step in (1, 7):
            scaled = jax.tree_util.tree_map(lambda x: x * step, params)
            manager.save(step, args=ocp.args.Composite(params=ocp.args.StandardSave(scaled)))
        manager.wait_until_finished()
    shutil.copy(plain / "model_config.json", root / "model_config.json")
    (root / "8.orbax-checkpoint-tmp-123").mkdir()  # an unfinished save is ignored
    _, restored = load_model_checkpoint(root)
    np.testing.assert_array_equal(restored["lm_head"]["kernel"], params["lm_head"]["kernel"] * 7)


# Orbax leaves an asyncio future behind when it fails on corrupt files; it is collected after its loop closed.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_checkpoint_errors_name_the_path(model, tmp_path):
    config, params, plain, _, _ = model
    with pytest.raises(FileNotFoundError, match="no Orbax params item"):
        load_model_checkpoint(tmp_path)
    broken = tmp_path / "broken"
    shutil.copytree(plain, broken)
    (broken / "model_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="broken/model_config.json"):
        load_model_checkpoint(broken)
    shutil.copy(plain / "model_config.json", broken / "model_config.json")
    for f in (broken / "params").rglob("*"):
        if f.is_file() and f.name != "_METADATA":
            f.write_bytes(b"garbage")
    with pytest.raises(ValueError, match="broken/params"):
        load_model_checkpoint(broken)
    wrong = tmp_path / "wrong"
    with pytest.raises(ValueError, match="do not match the model config"):
        save_model_checkpoint(wrong, params, config.replace(hidden_size=32))   # refused before writing
    assert not (wrong / "params").exists()
    save_model_checkpoint(wrong, params, config)
    (wrong / "model_config.json").write_text(json.dumps(config.replace(hidden_size=32).to_hf_dict()))
    with pytest.raises(ValueError, match="do not match"):
        load_model_checkpoint(wrong)
    with pytest.raises(FileExistsError):
        save_model_checkpoint(wrong, params, config)
