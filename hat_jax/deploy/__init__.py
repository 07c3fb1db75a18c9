"""Deployment: the full agent loop against a served model, the latency replay and the release gates.

- `chat_stream`: a streaming OpenAI-compatible chat-completions client with TTFT timing.
- `agent`: one viewer message -> harness -> model turns and MCP tool rounds -> reply or fallback.
- `versions`: the policy version and the harness version recorded in every report.
- `replay_stats`: per-concurrency percentiles, rates and the Table 7 style Markdown.
- `replay`: `python -m hat_jax.deploy.replay ...`, the paper's 110-request latency replay.
- `gates`: `python -m hat_jax.deploy.gates ...`, the three release gates (latency, business, general).
"""
