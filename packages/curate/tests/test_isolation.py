"""Isolated per-image work: a hung or ballooning task gets a reason, the pool carries on."""

from __future__ import annotations

import time

import pytest

from krea2.curate.isolation import IsolatedPool, IsolationTimeout


@pytest.fixture(scope="module")
def pool():
    p = IsolatedPool(processes=1, timeout_s=3.0, memory_mb=1024)
    yield p
    p.close()


def test_a_hung_task_times_out_and_the_pool_is_replaced(pool):
    start = time.monotonic()
    out = pool.map(time.sleep, [0, 60, 0])
    assert out[0] is None and isinstance(out[1], IsolationTimeout)
    assert time.monotonic() - start < 30
    assert pool.map(abs, [-3]) == [3]  # the replacement child works


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
