"""kbpg.pipeline.Ahead: items made on a thread of their own, handed over in order."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from kbpg.ingest.pipeline import SWITCH_S, Ahead


class Source:
    """A generator that records what it made, on which thread, and whether it was closed."""

    def __init__(self, n: int, fail_at: int | None = None) -> None:
        self.n, self.fail_at = n, fail_at
        self.made: list[int] = []
        self.threads: set[str] = set()
        self.closed = threading.Event()

    def __call__(self) -> Iterator[int]:
        try:
            for i in range(self.n):
                if i == self.fail_at:
                    raise ValueError(f"bad item {i}")
                self.threads.add(threading.current_thread().name)
                self.made.append(i)
                yield i
        finally:
            self.closed.set()


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_items_in_order_made_on_another_thread() -> None:
    source = Source(100)
    with Ahead(source(), depth=3, name="kbpg-test-ahead") as items:
        assert list(items) == list(range(100))
    assert source.threads == {"kbpg-test-ahead"}
    assert source.closed.is_set()


def test_runs_at_most_depth_items_ahead() -> None:
    source = Source(100)
    with Ahead(source(), depth=2) as items:
        iterator = iter(items)
        assert next(iterator) == 0
        # one taken, two waiting in the queue, one made and waiting to be handed over
        wait_for(lambda: len(source.made) == 4)
        time.sleep(0.3)
        assert source.made == [0, 1, 2, 3]
        assert next(iterator) == 1
        wait_for(lambda: len(source.made) == 5)


def test_an_exception_arrives_after_the_items_before_it() -> None:
    source = Source(10, fail_at=3)
    got: list[int] = []
    with pytest.raises(ValueError, match="bad item 3"), Ahead(source()) as items:
        got.extend(items)
    assert got == [0, 1, 2]


def test_leaving_early_stops_the_thread_and_closes_the_source() -> None:
    source = Source(1_000_000)
    with Ahead(source(), depth=2) as items:
        for i in items:
            if i == 5:
                break
    assert source.closed.is_set()
    assert len(source.made) <= 9  # 6 taken, at most 2 queued and 1 being handed over
    failing = Source(1_000_000)
    with pytest.raises(RuntimeError, match="consumer failed"), Ahead(failing()) as items:
        for i in items:
            if i == 5:
                raise RuntimeError("consumer failed")
    wait_for(failing.closed.is_set)
    assert len(failing.made) <= 9


def test_depth_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Ahead(iter([1]), depth=0)


def test_the_switch_interval_is_lowered_while_working_ahead_then_restored() -> None:
    before = sys.getswitchinterval()
    seen: list[float] = []

    def items() -> Iterator[int]:
        seen.append(sys.getswitchinterval())
        yield 1

    with Ahead(items()) as ahead:
        assert list(ahead) == [1]
        assert sys.getswitchinterval() == pytest.approx(min(before, SWITCH_S))
    assert seen == [pytest.approx(min(before, SWITCH_S))]
    assert sys.getswitchinterval() == before
    source = Source(5, fail_at=2)
    with pytest.raises(ValueError, match="bad item 2"), Ahead(source()) as failing:
        list(failing)
    assert sys.getswitchinterval() == before


def test_overlapping_aheads_restore_the_interval_once_the_last_leaves() -> None:
    before = sys.getswitchinterval()
    lowered = pytest.approx(min(before, SWITCH_S))
    first = Ahead(iter([1]))
    second = Ahead(iter([2]))
    first.__enter__()
    second.__enter__()
    first.__exit__(None)
    assert sys.getswitchinterval() == lowered  # the second still runs
    second.__exit__(None)
    assert sys.getswitchinterval() == before
