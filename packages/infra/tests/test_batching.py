"""The micro-batcher: batches close by size or deadline, keys take turns oldest first,
requests are never split, a failure reaches its whole batch, departed requests are dropped."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from krea2.infra.batching import MicroBatcher

FOREVER_MS = 600_000.0  # a batch closes only when full: the test decides who is in it


class Recorder:
    """A ``run_batch`` that records each batch's items and answers each item doubled;
    ``gate`` (when given) holds every batch until set, ``entered`` says one has begun."""

    def __init__(self, gate: threading.Event | None = None, fail_on: object = None) -> None:
        self.calls: list[list] = []
        self.gate, self.fail_on = gate, fail_on
        self.entered = threading.Event()

    def __call__(self, items: list) -> list:
        self.calls.append(list(items))
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(10)
        if self.fail_on in items:
            raise RuntimeError(f"bad item {self.fail_on}")
        return [item * 2 for item in items]


def run(scenario, run_batch, **kwargs):
    """Run ``scenario(batcher)`` (a coroutine function) with a batcher's loop going."""

    async def main():
        batcher = MicroBatcher(run_batch, **{"max_wait_ms": FOREVER_MS, **kwargs})
        task = asyncio.create_task(batcher.run())
        try:
            return await asyncio.wait_for(scenario(batcher), 10)
        finally:
            task.cancel()
            batcher.close()

    return asyncio.run(main())


async def settle():
    """Let the loop take every step it can without new input."""
    for _ in range(5):
        await asyncio.sleep(0.01)


def test_a_batch_closes_when_max_batch_units_wait():
    recorder = Recorder()

    async def scenario(batcher):
        return await asyncio.gather(*[batcher.submit(i) for i in (1, 2, 3)])

    assert run(scenario, recorder, max_batch=3) == [2, 4, 6]
    assert recorder.calls == [[1, 2, 3]]  # no wait: the deadline is ten minutes away


def test_a_batch_waits_for_max_batch_before_its_deadline():
    recorder = Recorder()

    async def scenario(batcher):
        first = batcher.submit(1)
        await settle()
        assert recorder.calls == [] and batcher.queued() == 1  # waits for a second unit
        second = batcher.submit(2)
        return await asyncio.gather(first, second)

    assert run(scenario, recorder, max_batch=2) == [2, 4]
    assert recorder.calls == [[1, 2]]


def test_a_batch_closes_when_the_oldest_has_waited_max_wait():
    recorder = Recorder()

    async def scenario(batcher):
        started = time.monotonic()
        result = await batcher.submit(5)
        return result, time.monotonic() - started

    result, waited = run(scenario, recorder, max_batch=8, max_wait_ms=30)
    assert result == 10 and recorder.calls == [[5]]
    assert waited >= 0.029


def test_keys_take_turns_oldest_first_even_when_another_key_is_full():
    recorder = Recorder()

    async def scenario(batcher):
        a1 = batcher.submit(("a", 1))
        b1, b2 = batcher.submit(("b", 1)), batcher.submit(("b", 2))
        await settle()
        assert recorder.calls == []  # b is full, but a is older: its batch comes first
        a2 = batcher.submit(("a", 2))
        await asyncio.gather(a1, b1, b2, a2)

    run(scenario, lambda items: recorder([i[1] for i in items]), max_batch=2, key=lambda i: i[0])
    assert recorder.calls == [[1, 2], [1, 2]]


def test_after_the_deadline_each_key_goes_in_arrival_order():
    seen: list = []

    def run_batch(items):
        seen.append(items)
        return items

    async def scenario(batcher):
        await asyncio.gather(*[batcher.submit(x) for x in ("a1", "b1", "a2", "c1", "b2")])

    run(scenario, run_batch, max_batch=8, max_wait_ms=1, key=lambda x: x[0])
    assert seen == [["a1", "a2"], ["b1", "b2"], ["c1"]]


def test_a_request_is_never_split_and_one_over_max_batch_is_a_batch_of_its_own():
    seen: list = []

    def run_batch(items):
        seen.append([n for n, _ in items])
        return items

    async def scenario(batcher):
        await asyncio.gather(*[batcher.submit((n, i)) for i, n in enumerate((3, 2, 1, 1))])

    run(scenario, run_batch, max_batch=2, size=lambda item: item[0])
    assert seen == [[3], [2], [1, 1]]


def test_an_exception_reaches_every_request_of_its_batch_and_the_loop_goes_on():
    recorder = Recorder(fail_on=2)

    async def scenario(batcher):
        failed = [batcher.submit(1), batcher.submit(2)]
        outcomes = await asyncio.gather(*failed, return_exceptions=True)
        after = await asyncio.gather(batcher.submit(3), batcher.submit(4))
        return outcomes, after

    outcomes, after = run(scenario, recorder, max_batch=2)
    assert [str(e) for e in outcomes] == ["bad item 2", "bad item 2"]
    assert all(isinstance(e, RuntimeError) for e in outcomes)
    assert after == [6, 8] and recorder.calls == [[1, 2], [3, 4]]


def test_a_wrong_number_of_results_fails_the_batch():
    async def scenario(batcher):
        return await asyncio.gather(batcher.submit(1), batcher.submit(2), return_exceptions=True)

    outcomes = run(scenario, lambda items: items[:1], max_batch=2)
    assert all("1 results for 2 requests" in str(e) for e in outcomes)


def test_a_cancelled_request_is_dropped_before_its_batch():
    gate = threading.Event()
    recorder = Recorder(gate)
    queued: list[int] = []

    async def scenario(batcher):
        first = batcher.submit(1)
        await asyncio.to_thread(recorder.entered.wait, 10)  # batch [1] runs, held at the gate
        gone, kept = batcher.submit(2), batcher.submit(3)
        assert batcher.queued() == 2
        gone.cancel()
        assert batcher.queued() == 1
        gate.set()
        return await asyncio.gather(first, kept)

    assert run(scenario, recorder, max_batch=1, max_wait_ms=0, on_queued=queued.append) == [2, 6]
    assert recorder.calls == [[1], [3]]  # 2 never ran
    assert sum(queued) == 0 and queued[:3] == [1, -1, 1]


def test_a_request_cancelled_while_its_batch_gathers_is_left_out():
    recorder = Recorder()

    async def scenario(batcher):
        first = batcher.submit(1)
        await settle()  # the batch of 1 is gathering, waiting for a second unit
        batcher.submit(2).cancel()
        return await first

    assert run(scenario, recorder, max_batch=2, max_wait_ms=300) == 2
    assert recorder.calls == [[1]]


def test_hooks_see_each_batch_size_and_the_batches_done():
    sizes: list[int] = []

    async def scenario(batcher):
        await asyncio.gather(*[batcher.submit(n) for n in (2, 2, 3)])
        return batcher.batches

    options = {"size": int, "on_batch": sizes.append, "max_wait_ms": 1}
    done = run(scenario, lambda items: items, max_batch=4, **options)
    assert sizes == [4, 3] and done == 2


def test_the_pause_point_holds_a_batch_until_the_event_ends_it(tmp_path, monkeypatch):
    notice = tmp_path / "paused"
    monkeypatch.setenv("KREA2_PAUSE_AT", "batcher test batches:1")
    monkeypatch.setenv("KREA2_PAUSE_NOTICE", str(notice))
    release = threading.Event()
    recorder = Recorder()

    async def scenario(batcher):
        assert await batcher.submit(1) == 2  # batch 0 runs: the pause waits for 1 done
        held = batcher.submit(2)
        while not notice.exists():
            await asyncio.sleep(0.01)
        await settle()
        assert not held.done() and recorder.calls == [[1]]
        release.set()
        return await held

    options = {"pause": "batcher test batches", "until": release, "max_wait_ms": 0}
    assert run(scenario, recorder, max_batch=1, **options) == 4
    assert "paused at batcher test batches 1" in notice.read_text()


def test_close_fails_the_requests_still_queued():
    async def main():
        batcher = MicroBatcher(lambda items: items, max_batch=1, max_wait_ms=0)
        waiting = batcher.submit(1)  # the loop never ran
        batcher.close(RuntimeError("shutting down"))
        with pytest.raises(RuntimeError, match="shutting down"):
            await waiting
        return batcher.queued()

    assert asyncio.run(main()) == 0


def test_max_batch_below_one_is_refused():
    with pytest.raises(ValueError, match="max_batch is 0"):
        MicroBatcher(lambda items: items, max_batch=0, max_wait_ms=1)
