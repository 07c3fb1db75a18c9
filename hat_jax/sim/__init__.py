"""The seeded live-stream world: catalog, viewers, tools, episode environment, teacher and MCP server.

`catalog.World.generate(seed)` draws the product catalog; `viewers.sample_tasks` draws viewer
requests (`types.Task`, with ground truth); `tools.WORLD_FUNCTIONS` are the tool functions over the
catalog (each declared once with `@world_tool`), `world_harness` what a harness may bind to here and the
shipped production harness, and `executor.execute_tool_call` runs a model's call under a harness (never raising on model
input); `env.LiveStreamEnv` is the episode environment (`reset` / `step` / `step_text`, tool rounds,
fault injection, hooks); `oracle.OracleTeacher` is the embedded strong teacher and
`policy.OpenAIChatPolicy` a real model over an OpenAI-compatible API; `rollout.rollout` and
`rollout.rejection_sample` run them. `python -m hat_jax.sim.mcp_server` serves a harness's tools over
MCP, and `mcp_client.ToolClient` / `SyncToolClient` call them with a per-call timeout.
"""
