"""CPU end to end: a `micro` checkpoint exported to HF, served by `transformers serve`, replayed through the agent.

The module builds one random-init `micro` checkpoint with a BPE tokenizer (our chat template), exports it
with `hat_jax.export.cli.export_hf` (what `export/to_hf.py` runs), serves the folder with the real
OpenAI-compatible `transformers serve --device cpu` on loopback (offline), and runs
`python -m hat_jax.deploy.replay` against it with the MCP tool server at concurrency 1 and 2. A random
model's turns run into `max_tokens`, so requests fall back ("truncated"); the test checks that the
report is complete and consistent, not that the model is good.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest
from local_servers import free_port, stop_process, wait_for_port

from hat_jax.deploy.chat_stream import ChatStreamClient, EndpointError
from hat_jax.export.cli import export_hf
from hat_jax.harness.render import render_system_prompt
from hat_jax.model import get_config, init_params
from hat_jax.model.checkpoint_io import save_model_checkpoint
from hat_jax.sim.world_harness import production_harness
from hat_jax.tokenizer import train_bpe_tokenizer

N, WARMUP = 4, 1


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(base_url, model id, hf_dir) of a micro export behind `transformers serve` on 127.0.0.1."""
    root = tmp_path_factory.mktemp("served")
    config = get_config("micro")
    save_model_checkpoint(root / "ckpt", init_params(config, jax.random.key(0)), config)
    corpus = [render_system_prompt(production_harness()), "宝宝问一下，这件怎么卖的？有货吗"] * 4
    train_bpe_tokenizer(corpus, config.vocab_size, root / "ckpt" / "tokenizer")
    hf = root / "hf"
    export_hf(root / "ckpt", hf, dtype="float32")
    port = free_port()
    (root / "hub").mkdir()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(root / "hub"), "OMP_NUM_THREADS": "1"}
    cli = Path(sys.executable).with_name("transformers")
    log = root / "serve.log"
    with open(log, "w") as err:
        proc = subprocess.Popen([str(cli), "serve", str(hf), "--device", "cpu", "--host", "127.0.0.1", "--port",
                                 str(port)], stdout=err, stderr=subprocess.STDOUT, env=env)  # fmt: skip
    try:
        wait_for_port(port, proc, 180, log)
        yield f"http://127.0.0.1:{port}/v1", str(hf), hf
    finally:
        stop_process(proc)


def test_replay_end_to_end_at_concurrency_1_and_2(served, mcp_url, tmp_path):
    base_url, model, _ = served
    out = tmp_path / "replay"
    proc = subprocess.run(
        [sys.executable, "-m", "hat_jax.deploy.replay", "--base-url", base_url, "--model", model, "--n", str(N),
         "--warmup", str(WARMUP), "--concurrency", "1", "2", "--mcp-url", mcp_url, "--max-tokens", "8",
         "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stderr  # 1: a report in which nothing succeeded (random weights)
    report = json.loads((out / "replay.json").read_text())
    assert report["server"]["preflight"] == "probed"  # transformers serve does not list its own folder
    assert report["versions"]["policy"] == {"version": model, "source": "served model id"}
    assert report["versions"]["harness"]["version"] == production_harness().version
    assert [lv["concurrency"] for lv in report["levels"]] == [1, 2]
    for level in report["levels"]:
        recs, s = level["requests"], level["summary"]
        assert [r["index"] for r in recs] == list(range(N)) and sum(r["warmup"] for r in recs) == WARMUP
        assert s["n"] == N - WARMUP
        assert sum(s["outcomes"].values()) == s["n"] and sum(s["failures"].values()) == s["n"] - s["n_success"]
        assert s["n_ttft_token"] == s["n"]  # every request streamed tokens
        assert 0 < s["p50_wall_s"] <= s["p95_wall_s"] and 0 < s["p50_ttft_token_s"] <= s["p95_ttft_token_s"]
        assert s["completion_tokens"] >= s["n"] and s["decode_tok_s"] > 0
        for r in recs:
            assert r["model_turns"] >= 1 and 0 < r["ttft_token_s"] <= r["wall_s"]
            assert r["outcome"] in ("replied", "fallback_reply", "no_reply")
            assert r["success"] == (r["failure"] is None)
        print(f"C={level['concurrency']}: wall P50/P95 {s['p50_wall_s']}/{s['p95_wall_s']} s, TTFT first token "
              f"P50/P95 {s['p50_ttft_token_s']}/{s['p95_ttft_token_s']} s, decode {s['decode_tok_s']} tok/s, "
              f"failures {s['failures']}")  # fmt: skip
    md = (out / "replay.md").read_text()
    assert "| C=1 |" in md and "| C=2 |" in md and md in proc.stdout
    assert "replay C=2" in proc.stderr  # the progress bar


def test_wrong_model_and_url_fail_fast_against_the_real_server(served):
    base_url, model, _ = served
    with ChatStreamClient(base_url, "not-the-model") as llm, pytest.raises(EndpointError) as wrong_model:
        llm.check_endpoint()
    assert wrong_model.value.status == 400 and "pinned" in wrong_model.value.body
    with ChatStreamClient(base_url.removesuffix("/v1"), model) as llm, pytest.raises(EndpointError) as wrong_url:
        llm.check_endpoint()
    assert wrong_url.value.status == 404 and "HTTP 404" in str(wrong_url.value)
