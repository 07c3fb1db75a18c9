#!/usr/bin/env bash
# Serve an exported hat-jax Hugging Face folder with vLLM (OpenAI-compatible), MTP speculative decoding on.
#
#   bash export/serve_vllm.sh HF_DIR [--mtp N] [--port P] [--served-model-name NAME] [--force-cpu] [--dry-run]
#                            [extra vllm serve args ...]
#
#   --mtp N       speculative tokens from the checkpoint's MTP block (default 3, the paper's deployment;
#                 0 = no speculative decoding)
#   --port P      default 8000
#   --served-model-name NAME   default: the folder's name
#   --force-cpu   start even without an NVIDIA GPU (the PyPI vllm wheel is a CUDA build: expect it to fail)
#   --dry-run     print the vllm command (and the venv it would use); creates, checks and runs nothing
# Any other argument goes to `vllm serve` unchanged (e.g. --max-model-len 32768 --gpu-memory-utilization 0.9).
# The VL drop-in layout (config.json with a vision_config) gets --language-model-only (text-only serving).
#
# vLLM pins its own torch and transformers (vllm 0.33.0: torch 2.14, transformers <5.21), so it cannot share
# the project's venv: a separate venv is made on first use, or reused.
#   HAT_VLLM_VENV   the venv (default: .venv-vllm at the repository root)
#   HAT_VLLM_SPEC   what pip installs there (default: vllm==0.33.0)
#   HAT_VLLM_PYTHON the interpreter that creates it (default: python3)
# Exit status: vllm's; 1 when there is no NVIDIA GPU (without --force-cpu), a bad HF_DIR or a failed install;
# 2 on a usage error.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${HAT_VLLM_VENV:-$repo/.venv-vllm}"
spec="${HAT_VLLM_SPEC:-vllm==0.33.0}"
python="${HAT_VLLM_PYTHON:-python3}"
prog="export/serve_vllm.sh"

usage() {
    sed -n '2,14s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2
    exit 2
}

hf_dir=""
mtp=3
port=8000
name=""
force_cpu=0
dry_run=0
extra=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        -h | --help) usage ;;
        --mtp) [[ $# -ge 2 ]] || usage; mtp="$2"; shift 2 ;;
        --mtp=*) mtp="${1#*=}"; shift ;;
        --port) [[ $# -ge 2 ]] || usage; port="$2"; shift 2 ;;
        --port=*) port="${1#*=}"; shift ;;
        --served-model-name) [[ $# -ge 2 ]] || usage; name="$2"; shift 2 ;;
        --served-model-name=*) name="${1#*=}"; shift ;;
        --force-cpu) force_cpu=1; shift ;;
        --dry-run) dry_run=1; shift ;;
        --) shift; extra+=("$@"); break ;;
        *)
            if [[ -z "$hf_dir" && "$1" != -* ]]; then hf_dir="$1"; else extra+=("$1"); fi
            shift ;;
    esac
done

[[ -n "$hf_dir" ]] || { echo "$prog: error: missing HF_DIR (an export/to_hf.py output folder)" >&2; usage; }
[[ "$mtp" =~ ^[0-9]+$ ]] || { echo "$prog: error: --mtp expects a number >= 0, got '$mtp'" >&2; exit 2; }
[[ "$port" =~ ^[0-9]+$ ]] || { echo "$prog: error: --port expects a number, got '$port'" >&2; exit 2; }
if [[ ! -f "$hf_dir/config.json" ]]; then
    echo "$prog: error: $hf_dir has no config.json (expected a folder written by export/to_hf.py)" >&2
    exit 1
fi
hf_dir="$(cd "$hf_dir" && pwd)"
[[ -n "$name" ]] || name="$(basename "$hf_dir")"

if [[ "$force_cpu" -eq 0 && "$dry_run" -eq 0 ]] && ! { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }; then
    echo "$prog: error: no NVIDIA GPU (nvidia-smi is missing or lists no GPU); the vllm wheel needs CUDA." \
        "On CPU serve with: transformers serve $hf_dir --device cpu (see export/README.md), or pass --force-cpu" >&2
    exit 1
fi

args=(serve "$hf_dir" --port "$port" --served-model-name "$name")
if [[ "$mtp" -gt 0 ]]; then
    args+=(--speculative-config "{\"method\":\"mtp\",\"num_speculative_tokens\":$mtp}")
fi
# The drop-in layout keeps the VL checkpoint's config.json (vision_config, ...ForConditionalGeneration).
if grep -Eq '"vision_config"|ForConditionalGeneration' "$hf_dir/config.json"; then
    args+=(--language-model-only)
fi
args+=("${extra[@]}")

if [[ "$dry_run" -eq 1 ]]; then
    printf 'venv: %s (%s)\n' "$venv" "$spec"
    printf '%q ' "$venv/bin/vllm" "${args[@]}"
    printf '\n'
    exit 0
fi

if [[ ! -x "$venv/bin/vllm" ]]; then
    echo "$prog: creating $venv with $spec (vLLM pins its own torch and transformers)" >&2
    "$python" -m venv "$venv" || { echo "$prog: error: could not create the venv $venv with $python" >&2; exit 1; }
    "$venv/bin/python" -m pip install --upgrade pip >&2
    "$venv/bin/python" -m pip install "$spec" >&2 || { echo "$prog: error: pip install $spec failed" >&2; exit 1; }
fi
echo "$prog: $venv/bin/vllm ${args[*]}" >&2
exec "$venv/bin/vllm" "${args[@]}"
