"""The harness h = (S, T, P, K) a model reads, and Harness-State Augmentation (HSA).

`state.HarnessState` holds skills (Agent Skills `SKILL.md`), tools (MCP tool definitions bound to
world functions), the system prompt's sections and lifecycle hooks. `loader.load_harness` reads and
validates a harness folder (`harness.yaml` + `skills/<name>/SKILL.md`) against the `WorldBindings` it is
given (the simulator's and the shipped production harness: `hat_jax.sim.world_harness`) and
`writer.dump_harness` writes one; `render.render_system_prompt`
and `render.render_tokens` turn a harness and a conversation into the prompt and token ids with the
loss mask; `hooks.HOOK_REGISTRY` and `constraints.CONSTRAINT_REGISTRY` are the only handlers and
checkable instructions a harness file may name; `hsa.compose` draws a task-preserving variant of a
harness with its name map, and `hsa.rewrite_messages` carries a trajectory over to it.
"""
