"""Isolated per-image work: a hung or ballooning task gets a reason, the pool carries on."""

from __future__ import annotations

import functools
import os
import time

import pytest

from krea2.curate.isolation import IsolatedPool, IsolationTimeout, WorkerCrash


@pytest.fixture(scope="module")
def pool():
    p = IsolatedPool(processes=1, timeout_s=3.0, memory_mb=1024, wall_timeout_s=2.0)
    yield p
    p.close()


def test_a_hung_task_times_out_and_the_pool_is_replaced(pool):
    start = time.monotonic()
    out = pool.map(time.sleep, [0, 60, 0])
    assert out[0] is None and out[2] is None and isinstance(out[1], IsolationTimeout)
    assert "wall time" in str(out[1])
    assert time.monotonic() - start < 60  # the task's own 60 s: cut short, not waited out
    assert pool.map(abs, [-3]) == [3]  # the replacement child works


def test_a_task_burning_cpu_is_stopped_by_its_cpu_time_limit():
    p = IsolatedPool(processes=1, timeout_s=1.0, memory_mb=1024, wall_timeout_s=120.0)
    try:
        # sum over a huge range: minutes of CPU time in one C call, no Python to interrupt
        out = p.map(sum, [range(10**12), range(4)])
    finally:
        p.close()
    assert isinstance(out[0], IsolationTimeout) and "CPU time" in str(out[0])
    assert out[1] == 6


def test_a_timed_out_task_is_retried_in_a_fresh_worker_before_it_is_given_up(pool):
    retried = pool.retried
    out = pool.map(time.sleep, [60])
    assert isinstance(out[0], IsolationTimeout)
    assert "then, in a fresh worker" in str(out[0])  # both attempts are named
    assert pool.retried == retried + 1


def test_a_crash_is_retried_then_reported_as_a_crash(pool):
    out = pool.map(os._exit, [3])
    assert isinstance(out[0], WorkerCrash) and "exit code 3" in str(out[0])
    assert pool.map(abs, [-2]) == [2]


def test_the_time_bound_does_not_count_worker_start_up():
    # Children that take 4 s to start (twice the per-item wall bound): before the fix the
    # bound counted from map(), so every item here timed out while its worker was starting.
    p = IsolatedPool(
        processes=2, timeout_s=1.0, memory_mb=1024, warm_up=functools.partial(time.sleep, 4)
    )
    try:
        assert p.map(time.sleep, [0.1] * 6) == [None] * 6
    finally:
        p.close()


def test_memory_beyond_the_address_space_limit_fails_only_that_task(pool):
    out = pool.map(bytearray, [2 * 2**30, 16])
    assert isinstance(out[0], MemoryError)
    assert out[1] == bytearray(16)


def test_each_child_runs_the_warm_up_before_it_takes_work():
    from krea2.curate.image_analysis import warm_up

    # Asked in the child (the task must be importable there, so a builtin and a string).
    ran = (
        "__import__('krea2.curate.image_analysis')"
        ".curate.image_analysis.warm_up.cache_info().currsize"
    )
    p = IsolatedPool(processes=1, timeout_s=60.0, memory_mb=3072, warm_up=warm_up)
    try:
        assert p.map(eval, [ran]) == [1]
    finally:
        p.close()


def test_a_child_stopped_from_outside_is_replaced_and_its_item_run_again():
    import signal

    p = IsolatedPool(processes=1, timeout_s=60.0, memory_mb=1024)
    try:
        pid = p.map(eval, ["__import__('os').getpid()"])[0]
        # the item kills its own child with SIGTERM, as a `kill` of the process group does
        # the first time; the fresh child runs it again (another pid, so it survives)
        code = f"(lambda os: os.kill(os.getpid(), 15) if os.getpid() == {pid} else 'ran')"
        out = p.map(eval, [code + "(__import__('os'))"])
        assert out == ["ran"] and p.retried == 0 and signal.SIGTERM == 15
    finally:
        p.close()
