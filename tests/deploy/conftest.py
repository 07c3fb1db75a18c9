"""Shared fixtures of the deploy tests: a real MCP tool server over Streamable HTTP and a client to it."""

from __future__ import annotations

import subprocess

import pytest
from local_servers import stop_process, wait_for_port, free_port

from hat_jax.sim.mcp_client import SyncToolClient, server_command
from hat_jax.sim.world_harness import PRODUCTION_DIR


@pytest.fixture(scope="session")
def mcp_url(tmp_path_factory):
    """URL of `python -m hat_jax.sim.mcp_server --transport http` (production harness, world seed 0)."""
    port = free_port()
    log = tmp_path_factory.mktemp("mcp") / "mcp_server.log"
    with open(log, "w") as err:
        proc = subprocess.Popen(server_command(PRODUCTION_DIR, 0, "--transport", "http", "--port", str(port)),
                                stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_for_port(port, proc, 60, log)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop_process(proc)


@pytest.fixture(scope="session")
def tool_client(mcp_url):
    """A connected `SyncToolClient` to the session's MCP tool server."""
    with SyncToolClient(url=mcp_url) as client:
        yield client
