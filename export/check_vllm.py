"""GPU check of an exported folder in vLLM: MTP speculative decoding is lossless, accepts drafts, and is faster.

Run it with the python of the vLLM venv (vLLM pins its own torch/transformers; `bash export/serve_vllm.sh`
creates `.venv-vllm` on first use), on a machine with an NVIDIA GPU:

    .venv-vllm/bin/python export/check_vllm.py exports/hat_text [--mtp 3] [--dtype float32] [--out check.json]

What it measures, in vLLM's offline Python API (`vllm.LLM`, `disable_log_stats=False`, prefix caching off),
once with `speculative_config={"method": "mtp", "num_speculative_tokens": N}` (default N = 3, the paper's
deployment) and once without, each in its own subprocess so the GPU memory of one is free for the other:
1. greedy outputs (temperature 0, `--max-new-tokens` tokens, eos ignored so every run has the same length) of
   `--prompts` prompts: identical with and without MTP (speculative decoding is lossless);
2. accepted draft tokens > 0: the `spec_decode` counters of `llm.get_metrics()` (drafts, draft tokens,
   accepted tokens; mean acceptance length = 1 + accepted / drafts);
3. decode tokens/s at concurrency 1 (one prompt) and 2 (two prompts in flight): per request
   (new tokens - 1) / (time of the full generation - time of a 1-token generation of the same batch, i.e. the
   prefill), and for the whole batch (x concurrency); the median of `--repeats` timings.
Prompts: chat-templated viewer questions through the folder's tokenizer, or (`--skip-tokenizer-init`, or a
folder without a tokenizer) fixed random token ids. The VL drop-in layout is loaded with
`language_model_only=True`.

Beside vLLM's acceptance it puts hat-jax's offline one, when the folder's `hat_export.json` carries it (the
experiment's evaluation, teacher-forced depth-1 acceptance on held-out Live QA oracle episodes; `to_hf.py`
copies it there): the two measure the same thing with `--mtp 1`; with N > 1 vLLM's rate averages over draft
depths 1..N (export/README.md, "Two acceptance figures").

Prints a table and a JSON summary (`--out` writes it). Exit status: 0 when greedy outputs are identical and
accepted draft tokens > 0; 1 when either fails; 2 when it cannot run here (no NVIDIA GPU, vllm not
importable by this python, no config.json in HF_DIR), with a one-line message. Not part of CI.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROG = "export/check_vllm.py"
QUESTIONS = ("这款口红多少钱？", "有没有适合油皮的粉底液？推荐一下", "今天直播间有什么优惠活动？",
             "这个包包是真皮的吗？什么时候发货？")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=PROG, description="MTP on/off check of an exported folder in vLLM. Run it with the vLLM venv's python "
        "(.venv-vllm/bin/python, made by export/serve_vllm.sh) on an NVIDIA GPU; exits 2 where it cannot run.")
    parser.add_argument("hf_dir", type=Path, help="a folder written by export/to_hf.py")
    parser.add_argument("--mtp", type=int, default=3, help="num_speculative_tokens with MTP on (default 3)")
    parser.add_argument("--prompts", type=int, default=4, help="prompts in the greedy comparison (default 4)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3, help="timings per setting; the median is reported")
    parser.add_argument("--dtype", default="auto", help="vLLM dtype: auto, bfloat16, float32 (default auto)")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    parser.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs (faster start, slower decode)")
    parser.add_argument("--skip-tokenizer-init", action="store_true", help="random token-id prompts, no tokenizer")
    parser.add_argument("--out", type=Path, help="write the JSON summary here")
    parser.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)   # internal: one setting, one process
    args = parser.parse_args(argv)
    if args.mtp < 1 or args.prompts < 2 or args.max_new_tokens < 2 or args.repeats < 1:
        parser.error("--mtp >= 1, --prompts >= 2, --max-new-tokens >= 2 and --repeats >= 1 are required")
    return args


def cannot_run_reason(hf_dir: Path) -> str | None:
    """Why this machine or interpreter cannot run the check (one line), or None."""
    if not (hf_dir / "config.json").is_file():
        return f"{hf_dir} has no config.json (expected a folder written by export/to_hf.py)"
    smi = shutil.which("nvidia-smi")
    listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60) if smi else None
    if listed is None or listed.returncode != 0 or "GPU" not in listed.stdout:
        return "no NVIDIA GPU (nvidia-smi is missing or lists none); this check needs vLLM on CUDA"
    if importlib.util.find_spec("vllm") is None:
        return (f"vllm is not importable by {sys.executable}; run this script with the vLLM venv's python, e.g. "
                f".venv-vllm/bin/python {PROG} {hf_dir} (bash export/serve_vllm.sh creates that venv)")
    return None


def _text_config(hf_dir: Path) -> tuple[dict, dict]:
    """(config.json, its text part: `text_config` of the VL layout, else the whole)."""
    config = json.loads((hf_dir / "config.json").read_text())
    return config, config.get("text_config", config)


def prompt_ids(hf_dir: Path, n: int, skip_tokenizer: bool) -> list[list[int]]:
    """`n` prompts as token ids (module docstring)."""
    _, text = _text_config(hf_dir)
    if not skip_tokenizer and (hf_dir / "tokenizer.json").is_file():
        import transformers

        tok = transformers.AutoTokenizer.from_pretrained(str(hf_dir), local_files_only=True)
        out = []
        for i in range(n):
            chat = tok.apply_chat_template([{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
                                           tokenize=False, add_generation_prompt=True)
            out.append(list(tok(chat, add_special_tokens=False)["input_ids"]))
        return out
    rng = random.Random(0)
    return [[rng.randrange(10, text["vocab_size"]) for _ in range(32)] for _ in range(n)]


def _spec_counters(llm) -> dict:
    """Sums of the spec_decode counters of `llm.get_metrics()` (drafts, draft tokens, accepted tokens)."""
    totals = {"num_drafts": 0.0, "num_draft_tokens": 0.0, "num_accepted_tokens": 0.0}
    for metric in llm.get_metrics():
        for key in totals:
            if metric.name.removesuffix("_total").endswith(f"spec_decode_{key}") and hasattr(metric, "value"):
                totals[key] += float(metric.value)
    return totals


def run_worker(args: argparse.Namespace, mtp: int) -> dict:
    """One setting (MTP on with `mtp` tokens, or off with 0) in this process: outputs, timings, counters."""
    from vllm import LLM, SamplingParams

    config, _ = _text_config(args.hf_dir)
    prompts = [{"prompt_token_ids": ids} for ids in prompt_ids(args.hf_dir, args.prompts, args.skip_tokenizer_init)]
    t0 = time.perf_counter()
    llm = LLM(model=str(args.hf_dir), dtype=args.dtype, max_model_len=args.max_model_len,
              gpu_memory_utilization=args.gpu_memory_utilization, enforce_eager=args.enforce_eager,
              disable_log_stats=False, enable_prefix_caching=False, skip_tokenizer_init=args.skip_tokenizer_init,
              language_model_only="vision_config" in config,
              speculative_config={"method": "mtp", "num_speculative_tokens": mtp} if mtp else None)
    load_s = time.perf_counter() - t0
    full = SamplingParams(temperature=0.0, max_tokens=args.max_new_tokens, ignore_eos=True,
                          detokenize=not args.skip_tokenizer_init)
    first = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, detokenize=not args.skip_tokenizer_init)

    def timed(batch, params) -> float:
        start = time.perf_counter()
        llm.generate(batch, params, use_tqdm=False)
        return time.perf_counter() - start

    timed(prompts[:2], full)                                                  # warm-up (graphs, kernels)
    outputs = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, full, use_tqdm=False)]
    timing = {}
    for concurrency in (1, 2):
        batch = prompts[:concurrency]
        decode = [timed(batch, full) - timed(batch, first) for _ in range(args.repeats)]
        per_request = (args.max_new_tokens - 1) / max(statistics.median(decode), 1e-9)
        timing[f"c{concurrency}"] = {"decode_s": [round(d, 4) for d in decode],
                                     "decode_tok_s_per_request": round(per_request, 2),
                                     "decode_tok_s_total": round(per_request * concurrency, 2)}
    import vllm

    return {"mtp": mtp, "vllm": vllm.__version__, "load_s": round(load_s, 2), "outputs": outputs,
            "timing": timing, "spec_decode": _spec_counters(llm)}


def _setting(args: argparse.Namespace, mtp: int, tmp: Path) -> dict:
    """Runs one setting in a subprocess of this script (the GPU memory is freed when it exits)."""
    out = tmp / f"mtp{mtp}.json"
    cmd = [sys.executable, os.path.abspath(__file__), str(args.hf_dir), "--prompts", str(args.prompts),
           "--max-new-tokens", str(args.max_new_tokens), "--repeats", str(args.repeats), "--dtype", args.dtype,
           "--max-model-len", str(args.max_model_len), "--gpu-memory-utilization", str(args.gpu_memory_utilization),
           "--worker-out", str(out)]
    cmd += ["--enforce-eager"] * args.enforce_eager + ["--skip-tokenizer-init"] * args.skip_tokenizer_init
    proc = subprocess.run(cmd, env=dict(os.environ, HAT_CHECK_VLLM_MTP=str(mtp)))
    if proc.returncode != 0 or not out.is_file():
        raise RuntimeError(f"the vLLM run with MTP {'off' if mtp == 0 else mtp} failed (exit {proc.returncode}); "
                           "its log is above")
    return json.loads(out.read_text())


def summarize(off: dict, on: dict) -> dict:
    """Compares the two settings: greedy identity, acceptance, decode speed-ups."""
    differing = [i for i, (a, b) in enumerate(zip(off["outputs"], on["outputs"])) if a != b]
    first_diff = {}
    for i in differing:
        a, b = off["outputs"][i], on["outputs"][i]
        first_diff[i] = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    spec = on["spec_decode"]
    accepted, drafted, drafts = spec["num_accepted_tokens"], spec["num_draft_tokens"], spec["num_drafts"]
    ratios = {c: round(on["timing"][c]["decode_tok_s_per_request"] / off["timing"][c]["decode_tok_s_per_request"], 3)
              for c in ("c1", "c2")}
    return {"greedy_identical": not differing, "differing_prompts": differing, "first_difference": first_diff,
            "accepted_tokens": accepted, "draft_tokens": drafted, "drafts": drafts,
            "acceptance_rate": round(accepted / drafted, 4) if drafted else None,
            "mean_acceptance_length": round(1 + accepted / drafts, 3) if drafts else None,
            "speedup": ratios, "mtp_off": {k: v for k, v in off.items() if k != "outputs"},
            "mtp_on": {k: v for k, v in on.items() if k != "outputs"}}


def offline_acceptance(provenance: dict | None) -> tuple[dict | None, str | None]:
    """hat-jax's offline MTP acceptance recorded in an export's `hat_export.json` (`provenance`, None when the
    folder has none): (its `mtp_acceptance` {"acceptance_depth1" share in [0, 1], "mean_accepted_length",
    "positions", "episodes", "results", ...}, None), or (None, why there is none)."""
    if provenance is None:
        return None, "the folder has no hat_export.json"
    if "mtp_acceptance" not in provenance:
        return None, "its hat_export.json predates the mtp_acceptance field (export the folder again)"
    if provenance["mtp_acceptance"] is None:
        return None, provenance.get("mtp_acceptance_reason") or "hat_export.json records none"
    return provenance["mtp_acceptance"], None


def acceptance_side_by_side(summary: dict, provenance: dict | None, mtp: int) -> dict:
    """vLLM's measured acceptance (from `summarize`) beside hat-jax's offline one (`offline_acceptance`).

    Returns:
        {"num_speculative_tokens": mtp, "comparable": mtp == 1 (vLLM's rate is then its depth-1 acceptance),
         "vllm_acceptance_rate", "vllm_mean_acceptance_length" (None without drafts),
         "hat_jax_acceptance_depth1", "hat_jax_mean_accepted_length", "hat_jax_positions", "hat_jax_source"
         (the results.json it came from; all four None when there is none), "hat_jax_reason" (why none, or None)}.
    """
    offline, reason = offline_acceptance(provenance)
    get = (lambda k: None) if offline is None else offline.get  # noqa: E731
    return {"num_speculative_tokens": mtp, "comparable": mtp == 1,
            "vllm_acceptance_rate": summary["acceptance_rate"],
            "vllm_mean_acceptance_length": summary["mean_acceptance_length"],
            "hat_jax_acceptance_depth1": get("acceptance_depth1"),
            "hat_jax_mean_accepted_length": get("mean_accepted_length"), "hat_jax_positions": get("positions"),
            "hat_jax_source": get("results"), "hat_jax_reason": reason}


def _figure(value, digits: int) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def acceptance_table(side: dict) -> list[str]:
    """The acceptance rows of the printed table (`acceptance_side_by_side`'s dict)."""
    mtp = side["num_speculative_tokens"]
    rows = [f"| acceptance | hat-jax offline (teacher-forced, depth 1) | vLLM measured (MTP {mtp}) |", "|---|---|---|",
            f"| per draft token | {_figure(side['hat_jax_acceptance_depth1'], 4)} | "
            f"{_figure(side['vllm_acceptance_rate'], 4)} |",
            f"| mean accepted length | {_figure(side['hat_jax_mean_accepted_length'], 4)} (1 speculative token) | "
            f"{_figure(side['vllm_mean_acceptance_length'], 3)} ({mtp} speculative token{'s' * (mtp != 1)}) |", ""]
    if side["hat_jax_reason"] is not None:
        rows.append(f"hat-jax offline acceptance: none ({side['hat_jax_reason']})")
    else:
        rows.append(f"hat-jax offline acceptance: {side['hat_jax_positions']} positions, from {side['hat_jax_source']}")
    if not side["comparable"]:
        rows.append(f"with MTP {mtp} vLLM's rate averages over draft depths 1..{mtp} (a deeper draft counts only "
                    "after the earlier ones are accepted); run with --mtp 1 to compare depth 1 with depth 1")
    return rows


def table(summary: dict, mtp: int) -> str:
    rows = ["| concurrency | MTP off tok/s | MTP on tok/s | on/off |", "|---|---|---|---|"]
    for c in ("c1", "c2"):
        off = summary["mtp_off"]["timing"][c]["decode_tok_s_per_request"]
        on = summary["mtp_on"]["timing"][c]["decode_tok_s_per_request"]
        rows.append(f"| {c[1:]} | {off:.2f} | {on:.2f} | {summary['speedup'][c]:.2f}x |")
    rows.append("")
    rows.append(f"greedy identical with/without MTP {mtp}: {summary['greedy_identical']}"
                + (f" (differing prompts {summary['differing_prompts']})" if not summary["greedy_identical"] else ""))
    rows.append(f"accepted draft tokens: {summary['accepted_tokens']:.0f} of {summary['draft_tokens']:.0f} "
                f"(rate {summary['acceptance_rate']}, mean acceptance length {summary['mean_acceptance_length']})")
    if "acceptance" in summary:
        rows += [""] + acceptance_table(summary["acceptance"])
    return "\n".join(rows)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker_out is not None:                    # internal: one setting
        result = run_worker(args, int(os.environ["HAT_CHECK_VLLM_MTP"]))
        args.worker_out.write_text(json.dumps(result))
        return 0
    reason = cannot_run_reason(args.hf_dir)
    if reason is not None:
        print(f"{PROG}: cannot run: {reason}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="check_vllm_") as tmp:
        try:
            off = _setting(args, 0, Path(tmp))
            on = _setting(args, args.mtp, Path(tmp))
        except RuntimeError as err:
            print(f"{PROG}: {err}", file=sys.stderr)
            return 1
    summary = dict(summarize(off, on), hf_dir=str(args.hf_dir), num_speculative_tokens=args.mtp,
                   max_new_tokens=args.max_new_tokens, prompts=args.prompts, dtype=args.dtype)
    path = args.hf_dir / "hat_export.json"
    provenance = json.loads(path.read_text()) if path.is_file() else None
    if provenance is not None:
        summary["policy_version"] = provenance.get("policy_version")
    summary["acceptance"] = acceptance_side_by_side(summary, provenance, args.mtp)
    print(table(summary, args.mtp))
    if args.out is not None:
        args.out.write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary))
    return 0 if summary["greedy_identical"] and summary["accepted_tokens"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
