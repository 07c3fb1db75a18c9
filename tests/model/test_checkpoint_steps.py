"""The filter for the late callbacks of reads that a failed Orbax restore abandoned."""

import asyncio
import gc
import sys

from hat_jax.model.checkpoint_steps import silence_abandoned_reads


def _unraisable(exc: BaseException, caught: list) -> None:
    """Raises `exc` inside a finalizer, where Python hands it to `sys.unraisablehook`."""
    class Finalized:
        def __del__(self):
            raise exc
    previous = sys.unraisablehook
    sys.unraisablehook = lambda u: caught.append(u.exc_type)
    try:
        silence_abandoned_reads()          # wraps the recording hook
        silence_abandoned_reads()          # a second call does not wrap it again
        assert getattr(sys.unraisablehook, "_hat_jax_filter", False)
        Finalized()
        gc.collect()
    finally:
        sys.unraisablehook = previous


def _closed_loop_error() -> RuntimeError:
    loop = asyncio.new_event_loop()
    loop.close()
    try:
        loop.call_soon_threadsafe(lambda: None)
    except RuntimeError as err:
        return err
    raise AssertionError("a closed loop accepted a callback")


def test_the_closed_loop_callback_is_dropped_and_other_errors_pass():
    caught = []
    _unraisable(_closed_loop_error(), caught)
    assert caught == []
    _unraisable(RuntimeError("Event loop is closed"), caught)   # same message, not from call_soon_threadsafe
    _unraisable(ValueError("anything else"), caught)
    assert caught == [RuntimeError, ValueError]


def test_never_retrieved_read_errors_of_a_failed_restore_are_dropped_and_other_asyncio_records_pass():
    import logging

    silence_abandoned_reads()
    caught = []

    class Keep(logging.Handler):
        def emit(self, record):
            caught.append(record.getMessage().splitlines()[0])

    log = logging.getLogger("asyncio")
    handler = Keep()
    log.addHandler(handler)
    try:
        read_error = ValueError('OUT_OF_RANGE: Error reading "lm_head.kernel/0.0" in OCDBT database at local file')
        log.error("Task exception was never retrieved\nfuture: <Task>", exc_info=(ValueError, read_error, None))
        log.error("Task exception was never retrieved\nfuture: <Task>", exc_info=(KeyError, KeyError("tool"), None))
        log.error("Unclosed client session")
    finally:
        log.removeHandler(handler)
    assert caught == ["Task exception was never retrieved", "Unclosed client session"]
