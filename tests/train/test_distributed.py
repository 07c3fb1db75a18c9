"""Several processes on loopback (gloo CPU collectives) equal one process; bad process counts fail fast.

- 3 SFT steps (micro, fp32, packed rows, 2 micro-batches of 2 rows on a mesh fsdp 2 x expert 4) run by
  2 processes x 4 simulated devices end with the params of 1 process x 8 devices (atol 4e-6), with the same
  per-step losses (the MTP loss included) and the same files in the run directory (process 0 alone writes the non-Orbax ones). Each
  process holds rows 0, 2 or 1, 3 of the 4-row batch: one row of each micro-batch.
- 2 RL steps from that SFT run (2 tasks x 2 samples: each process's devices generate their rows of the
  rollouts, gathered to every process; the update on 2 rows per process) end with the same params, rewards
  and losses as 1 process.
- a run started with more processes than the coordinator expects fails in every process within 60 s, naming
  the reason.
- the argument checks and the host-row selection of the data pipelines, in this process.
The subprocesses share one HAT_JAX_CACHE (tokenizer, world data) and have timeouts.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import grain
import numpy as np
import pytest

from device_worker import device_env
from hat_jax.data.host_rows import HostRows, TakeRows
from hat_jax.train.distributed import explicit_processes

# lr 1e-3 (the preset's 3e-3 / 3): the all-reduce sums the gradient in another order over gloo than inside one
# process, and Adam's normalised step turns that rounding of a near-zero gradient into a step-size difference;
# at 3e-3 one of the 930,696 parameters differed by 1.7e-6 after 3 steps (22 by more than 1e-7). The MTP loss
# (mtp_coef 0.1, on by default) adds near-zero gradients on the shared embedding and the experts: at lr 1e-3 one
# parameter of each run then differed by 1.3e-6 (SFT, embed_tokens) and 1.5e-6 (RL, an expert's gate_up_proj).
# A wrong row split or a missed all-reduce moves every parameter by ~lr; 4e-6 keeps that visible.
PARAM_ATOL = 4e-6
RUN = ["--preset", "micro", "--steps", "3", "--hsa", "off", "--no-progress", "--set", "ckpt_every=3",
       "--set", "log_every=1", "--set", "data.batch_size=4", "--set", "accum_steps=2", "--set", "mesh=[1,2,4,1]",
       "--set", "optim.lr=1e-3"]
RL_RUN = ["--preset", "micro", "--steps", "2", "--no-progress", "--set", "log_every=1", "--set", "ckpt_every=2",
          "--set", "mesh=[1,2,4,1]"]
TIMEOUT_S = 900


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stage(module: str, out: Path, env: dict, *args: str) -> subprocess.Popen:
    """`python -m hat_jax.train.<module> --out out *args`, its stderr into a file beside `out` (no pipe to fill
    while another process is waited on)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    log = open(out.parent / f"{out.name}-{time.monotonic_ns()}.stderr", "w+")
    proc = subprocess.Popen([sys.executable, "-m", f"hat_jax.train.{module}", "--out", str(out), *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=log, text=True)
    proc.log = log
    return proc


def sft(out: Path, env: dict, *extra: str) -> subprocess.Popen:
    return stage("sft", out, env, *RUN, *extra)


def processes(i: int, n: int = 2, port: int | None = None) -> tuple[str, ...]:
    return ("--coordinator", f"127.0.0.1:{port}", "--num-processes", str(n), "--process-id", str(i))


def one_and_two(module: str, root: Path, env: dict, *args: str) -> tuple[Path, Path]:
    """The stage run by 1 process x 8 devices into root/one, then by 2 processes x 4 devices into root/two."""
    [(rc, err)] = communicate_all([stage(module, root / "one", device_env(env, 8), *args)], TIMEOUT_S)
    assert rc == 0, err[-4000:]
    port = free_port()
    procs = [stage(module, root / "two", device_env(env, 4), *args, *processes(i, 2, port)) for i in range(2)]
    for i, (rc, err) in enumerate(communicate_all(procs, TIMEOUT_S)):
        assert rc == 0, f"process {i}:\n{err[-4000:]}"
    return root / "one", root / "two"


def communicate_all(procs: list[subprocess.Popen], timeout: float) -> list[tuple[int, str]]:
    """(returncode, stderr) of each process; all are killed when one outlives `timeout`."""
    deadline, results = time.monotonic() + timeout, []
    try:
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
            p.log.seek(0)
            results.append((p.returncode, p.log.read()))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            p.log.close()
    return results


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    return {**os.environ, "HAT_JAX_CACHE": str(tmp_path_factory.mktemp("cache"))}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, env):
    """(one-process SFT run dir, two-process SFT run dir)."""
    return one_and_two("sft", tmp_path_factory.mktemp("sft"), env, *RUN)


@pytest.fixture(scope="module")
def rl_runs(tmp_path_factory, env, runs):
    """(one-process, two-process) RL run dirs: 2 steps from the one-process SFT run, 2 tasks x 2 samples."""
    return one_and_two("rl", tmp_path_factory.mktemp("rl"), env, *RL_RUN, "--init", str(runs[0]))


def assert_same_params(one_dir: Path, two_dir: Path) -> None:
    import jax

    from hat_jax.model.checkpoint_io import load_model_checkpoint

    _, one = load_model_checkpoint(one_dir, host=True)
    _, two = load_model_checkpoint(two_dir, host=True)
    flat_one = jax.tree_util.tree_leaves_with_path(one)
    flat_two = jax.tree_util.tree_leaves(two)
    assert len(flat_one) == len(flat_two)
    for (path, a), b in zip(flat_one, flat_two):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=0, atol=PARAM_ATOL,
                                   err_msg=jax.tree_util.keystr(path))


def test_two_processes_end_with_the_params_of_one(runs):
    assert_same_params(*runs)


def test_rl_two_processes_end_with_the_params_of_one(rl_runs):
    from hat_jax.train.metrics import read_metrics

    assert_same_params(*rl_runs)
    one, two = (read_metrics(r) for r in rl_runs)
    assert [m["step"] for m in one] == [m["step"] for m in two] == [1, 2]
    for key in ("reward/total", "rollout/tokens", "rollout/seq_len", "adv/mean"):  # the same rollouts
        assert [m[key] for m in two] == [m[key] for m in one], key
    for key in ("train/loss", "train/lb_loss", "train/grad_norm"):
        np.testing.assert_allclose([m[key] for m in two], [m[key] for m in one], rtol=1e-5, atol=1e-7, err_msg=key)


def test_same_losses_and_only_process_zero_writes_the_run_files(runs):
    from hat_jax.train.metrics import read_metrics

    one, two = (read_metrics(r) for r in runs)
    assert [m["step"] for m in one] == [m["step"] for m in two] == [1, 2, 3]
    np.testing.assert_allclose([m["train/loss"] for m in two], [m["train/loss"] for m in one], rtol=0, atol=1e-5)

    def files(root: Path) -> set[str]:  # the non-Orbax files (Orbax shards by process); event files are named
        return {str(p.relative_to(root)) for p in root.rglob("*")  # after host and pid
                if p.is_file() and "tfevents" not in p.name and not p.relative_to(root).parts[0].isdigit()}

    assert files(runs[1]) == files(runs[0])
    assert len(list(runs[1].glob("*tfevents*"))) == len(list(runs[0].glob("*tfevents*"))) == 1


def test_more_processes_than_the_coordinator_expects_end_with_the_reason(tmp_path, env):
    """Process 0 runs a coordinator for 2; processes 1 and 2 were told 3: 1 joins and every joined process
    raises the mismatch, 2 is refused by the coordinator or, when that has already ended, by the join's
    deadline, or (a slow start on a loaded machine) finds no coordinator at all. All three end by themselves: none waits for a process that never comes (`communicate_all`
    raises TimeoutExpired and kills them otherwise)."""
    port = free_port()
    counts = (2, 3, 3)
    procs = [sft(tmp_path / "run", device_env(env, 1), *processes(i, n, port), "--init-timeout", "30")
             for i, n in enumerate(counts)]
    results = communicate_all(procs, 600)
    assert all(rc != 0 for rc, _ in results), [rc for rc, _ in results]
    for rc, err in results[:2]:
        assert rc == 2 and "DistributedStartError: the coordinator expects 2 processes" in err, err[-3000:]
        assert "process 1: started with --num-processes 3 --process-id 1" in err
    refused = ("Unexpected task registered", "DEADLINE_EXCEEDED",  # by the coordinator, or it had already gone
               f"process 2: no coordinator at 127.0.0.1:{port} after 30 s")  # gone before process 2 looked
    assert any(r in results[2][1] for r in refused), results[2][1][-3000:]
    assert not (tmp_path / "run" / "stage_config.json").exists()


@pytest.mark.parametrize("args, message", [
    (("127.0.0.1:1234", 2, None), "missing: --process-id"),
    (("127.0.0.1", 2, 0), "expected HOST:PORT"),
    (("127.0.0.1:99999", 2, 0), "expected HOST:PORT"),
    (("127.0.0.1:1234", 0, 0), "--num-processes = 0: expected >= 1"),
    (("127.0.0.1:1234", 2, 2), "--process-id = 2: expected 0..1"),
])
def test_bad_process_arguments_are_named(args, message):
    with pytest.raises(ValueError, match=message):
        explicit_processes(*args, env={})


def test_a_process_without_its_coordinator_fails_with_the_reason():
    from hat_jax.train.distributed import DistributedStartError, initialize

    t0 = time.monotonic()
    with pytest.raises(DistributedStartError, match=rf"process 1: no coordinator at 127.0.0.1:{(port := free_port())} "
                                                    r"after 2 s; process 0 hosts it"):
        initialize(f"127.0.0.1:{port}", 2, 1, timeout_s=2)  # raises before JAX's runtime is touched
    assert time.monotonic() - t0 < 10


def test_processes_from_the_environment():
    env = {"JAX_COORDINATOR_ADDRESS": "10.0.0.2:8476", "JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "3"}
    assert explicit_processes(None, None, None, env=env) == ("10.0.0.2:8476", 4, 3)
    assert explicit_processes(None, None, None, env={}) is None
    with pytest.raises(ValueError, match="missing: JAX_PROCESS_ID"):
        explicit_processes(None, None, None, env={**env, "JAX_PROCESS_ID": ""})


def test_host_rows_read_only_their_rows_in_the_global_order():
    ds = grain.MapDataset.range(22)  # 5 global batches of 4 (the last 2 elements dropped)
    local = HostRows(ds, 4, [1, 3])
    assert len(local) == 10
    assert [list(b) for b in local.batch(2)] == [[4 * b + 1, 4 * b + 3] for b in range(5)]
    batch = {"x": np.arange(8).reshape(4, 2)}
    assert TakeRows([0, 2], 4).map(batch)["x"].tolist() == [[0, 1], [4, 5]]
    with pytest.raises(ValueError, match="increasing row indices in 0..3"):
        HostRows(ds, 4, [3, 1])
