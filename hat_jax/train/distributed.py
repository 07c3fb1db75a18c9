"""Several processes as one JAX program: joining JAX's distributed runtime, and which process writes files.

Every process (host) runs the same command; `jax.distributed.initialize` joins them into one runtime, after
which `jax.devices()` lists every process's devices, a `Mesh` over them is global, and a jitted step runs on
all of them at once (GSPMD inserts the collectives; on CPU they go through gloo). Where a run takes its
processes from, in this order (`initialize_from_args`):

1. `--coordinator HOST:PORT --num-processes N --process-id I` (all three, on every process; process 0 runs the
   coordinator service at HOST:PORT, the others connect to it);
2. the environment `JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES`, `JAX_PROCESS_ID` (the same three);
3. `--distributed`: `jax.distributed.initialize()` with JAX's cluster auto-detection (a TPU pod slice, SLURM,
   Open MPI, ...: every host runs the same command and JAX finds the coordinator and its own id);
4. none of them: one process, no runtime started (the default; nothing changes for a single-process run).

Bad input fails at start with the reason: an incomplete triple, a malformed address, an id outside 0..N-1
(ValueError before anything connects); a process whose N differs from the coordinator's (`check_processes`:
every process compares the N and id it was started with against what the coordinator registered, and all of
them raise DistributedStartError naming the processes that disagree); a process beyond the coordinator's
count is refused by the coordinator itself ("Unexpected task registered", the process aborts), and processes
that do not all arrive within `timeout_s` (default 60) end with JAX's DEADLINE_EXCEEDED. Before connecting,
each process logs the coordinator, its id and N, so the reason can be read in every process's log.

Files: only process 0 (`is_primary`) writes the run's JSON and text files, the tokenizer copy and the
TensorBoard/metrics files; Orbax checkpoints are written by every process (Orbax coordinates them).
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from collections.abc import Mapping

import jax
import numpy as np

log = logging.getLogger(__name__)
ENV_VARS = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")
DEFAULT_TIMEOUT_S = 60


class DistributedStartError(RuntimeError):
    """The processes of a run disagree on how many they are, or on their ids (the message lists them), or a
    process finds no coordinator to join."""


def wait_for_coordinator(coordinator: str, timeout_s: float, process_id: int) -> None:
    """Waits until something accepts TCP connections at `coordinator` (HOST:PORT), polling every 0.5 s: a
    process other than 0 checks that process 0's coordinator is up before joining, since JAX aborts the process
    (SIGABRT, a C++ stack trace) when it cannot register in time.

    Raises:
      DistributedStartError: nothing listens there within `timeout_s` seconds (names the address and process).
    """
    import socket

    host, _, port = coordinator.rpartition(":")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
                return
        except OSError:
            if time.monotonic() >= deadline:
                raise DistributedStartError(
                    f"process {process_id}: no coordinator at {coordinator} after {timeout_s:g} s; process 0 hosts "
                    f"it: start it with the same --coordinator (or raise --init-timeout)") from None
            time.sleep(0.5)


def add_distributed_args(parser: argparse.ArgumentParser) -> None:
    """--coordinator, --num-processes, --process-id, --distributed and --init-timeout (module docstring)."""
    group = parser.add_argument_group("several processes (module hat_jax.train.distributed)")
    group.add_argument("--coordinator", metavar="HOST:PORT",
                       help="address of process 0's coordinator service (with --num-processes, --process-id)")
    group.add_argument("--num-processes", type=int, metavar="N", help="processes in the run (hosts)")
    group.add_argument("--process-id", type=int, metavar="I", help="this process's id, 0..N-1 (0 runs the coordinator)")
    group.add_argument("--distributed", action="store_true",
                       help="jax.distributed.initialize() with cluster auto-detection (TPU pod slice, SLURM, MPI)")
    group.add_argument("--init-timeout", type=int, default=DEFAULT_TIMEOUT_S, metavar="S",
                       help=f"seconds to wait for every process to join (default {DEFAULT_TIMEOUT_S})")


def explicit_processes(coordinator: str | None, num_processes: int | None, process_id: int | None,
                       env: Mapping[str, str] | None = None) -> tuple[str, int, int] | None:
    """(coordinator, N, id) from the arguments, else from `ENV_VARS` of `env` (default os.environ); None when
    neither gives any.

    Raises:
      ValueError: only some of the three given (names the missing ones), an address that is not HOST:PORT with
        a port in 1..65535, N < 1, or an id outside 0..N-1; an environment value that is not an integer.
    """
    args = (coordinator, num_processes, process_id)
    source, names = "arguments", ("--coordinator", "--num-processes", "--process-id")
    if all(a is None for a in args):
        env = os.environ if env is None else env
        raw = tuple(env.get(k) or None for k in ENV_VARS)
        if all(r is None for r in raw):
            return None
        source, names = "environment", ENV_VARS
        try:
            args = (raw[0], *(None if r is None else int(r) for r in raw[1:]))
        except ValueError:
            raise ValueError(f"{ENV_VARS[1]} / {ENV_VARS[2]} = {raw[1]!r} / {raw[2]!r}: expected integers") from None
    missing = [n for n, a in zip(names, args) if a is None]
    if missing:
        raise ValueError(f"several processes need all of {', '.join(names)} ({source}); missing: {', '.join(missing)}")
    coordinator, num_processes, process_id = args
    host, _, port = coordinator.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{names[0]} {coordinator!r}: expected HOST:PORT (e.g. 10.0.0.2:8476), port in 1..65535")
    if num_processes < 1:
        raise ValueError(f"{names[1]} = {num_processes}: expected >= 1")
    if not 0 <= process_id < num_processes:
        raise ValueError(f"{names[2]} = {process_id}: expected 0..{num_processes - 1} ({names[1]} = {num_processes})")
    return coordinator, num_processes, process_id


def initialize_from_args(args: argparse.Namespace) -> bool:
    """Joins the run's processes as the parsed `add_distributed_args` say (module docstring); True when a
    distributed runtime was started (False: one process, nothing done). Call before anything touches a device.

    Raises:
      ValueError: as `explicit_processes`; --distributed together with an explicit triple.
      DistributedStartError: as `check_processes`.
    """
    explicit = explicit_processes(args.coordinator, args.num_processes, args.process_id)
    if explicit is not None and args.distributed and args.coordinator is not None:
        raise ValueError("--distributed auto-detects the processes: give it or --coordinator/--num-processes/"
                         "--process-id, not both")
    if explicit is None and not args.distributed:
        return False
    initialize(*(explicit or (None, None, None)), timeout_s=args.init_timeout)
    return True


def initialize(coordinator: str | None = None, num_processes: int | None = None, process_id: int | None = None, *,
               timeout_s: int = DEFAULT_TIMEOUT_S) -> None:
    """`jax.distributed.initialize` (auto-detected when the three are None), gloo CPU collectives, then
    `check_processes`. Logs what it joins before connecting (an abort inside JAX then has its context).

    A process other than 0 first waits for the coordinator to listen (`wait_for_coordinator`); a process that
    JAX's coordinator does not register within the timeout (another process missing) is aborted by JAX itself.

    Raises:
      DistributedStartError: as `check_processes`; no coordinator within timeout_s (process id > 0).
      RuntimeError: JAX's, e.g. called twice.
    """
    who = ("auto-detected processes" if coordinator is None
           else f"coordinator {coordinator} as process {process_id} of {num_processes}")
    log.info("joining the JAX distributed runtime: %s (waiting up to %d s for every process)", who, timeout_s)
    t0 = time.perf_counter()
    if coordinator is not None and process_id:
        wait_for_coordinator(coordinator, timeout_s, process_id)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator, num_processes, process_id,
                               initialization_timeout=max(1, int(timeout_s - (time.perf_counter() - t0))))
    check_processes(num_processes, process_id)
    log.info("process %d of %d: %d local of %d devices (%.1f s to join)", jax.process_index(), jax.process_count(),
             jax.local_device_count(), jax.device_count(), time.perf_counter() - t0)


def check_processes(num_processes: int | None, process_id: int | None) -> None:
    """Every process's (N, id) as it was started, gathered across the runtime and compared with the coordinator's
    count (`jax.process_count()`) and each process's registered index. Collective: every process calls it.

    Raises:
      DistributedStartError (in every process): some process was started with another N or id than the
        coordinator registered (lists each process's started and registered values).
    """
    from jax.experimental import multihost_utils

    mine = np.asarray([-1 if num_processes is None else num_processes, -1 if process_id is None else process_id,
                       jax.process_index()], np.int32)
    table = np.asarray(multihost_utils.process_allgather(mine)).reshape(-1, 3)
    count = jax.process_count()
    bad = [(n, i, r) for n, i, r in table.tolist() if (n != -1 and n != count) or (i != -1 and i != r)]
    if bad:
        rows = "; ".join(f"process {r}: started with --num-processes {n} --process-id {i}" for n, i, r in table.tolist())
        raise DistributedStartError(f"the coordinator expects {count} processes, but {len(bad)} of the processes that "
                                    f"joined were started otherwise ({rows}); start every process with the same "
                                    f"--num-processes and ids 0..{count - 1}")


def is_primary() -> bool:
    """True in process 0 (and in a single-process run): the one process that writes the run's non-Orbax files."""
    return jax.process_index() == 0
