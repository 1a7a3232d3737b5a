"""The download's worker threads and slot gate (transfer.tasks): every
submitted call runs, in order on one worker, before close returns; a call
that raises does not stop its worker; the gate holds at most its count."""

from __future__ import annotations

import threading

import pytest

from datamount.transfer.tasks import Gate, Tasks

pytestmark = pytest.mark.unit


def test_every_task_runs_in_order_before_close_returns() -> None:
    done: list[int] = []
    with Tasks(1, "t") as tasks:
        for i in range(200):
            tasks.submit(done.append, i)
    assert done == list(range(200))


def test_many_workers_run_every_task_and_tasks_may_submit_more() -> None:
    done: list[int] = []
    lock = threading.Lock()
    tasks = Tasks(4, "t")

    def record(i: int) -> None:
        with lock:
            done.append(i)

    def spawn(i: int) -> None:  # a restart schedules from a worker, as the Downloader does
        tasks.submit(record, i)

    release = threading.Event()
    tasks.submit(release.wait)
    for i in range(100):
        tasks.submit(spawn, i)
    release.set()
    while True:
        with lock:
            if len(done) == 100:
                break
        threading.Event().wait(0.01)
    tasks.close()
    assert sorted(done) == list(range(100))


def test_a_failing_task_keeps_its_worker_and_submit_after_close_is_refused() -> None:
    done: list[str] = []
    tasks = Tasks(1, "t")
    tasks.submit(lambda: 1 / 0)
    tasks.submit(done.append, "after")
    tasks.close()
    assert done == ["after"]
    tasks.close()  # twice: nothing
    with pytest.raises(RuntimeError):
        tasks.submit(done.append, "late")


def test_the_gate_holds_at_most_its_count() -> None:
    gate = Gate(2)
    gate.take()
    gate.take()
    assert gate.available == 0
    taken = threading.Event()
    waiter = threading.Thread(target=lambda: (gate.take(), taken.set()))
    waiter.start()
    assert not taken.wait(0.2)  # both slots are out: take waits
    gate.give()
    assert taken.wait(5)
    waiter.join(5)


def test_a_waiting_taker_resumes_once_half_the_slots_are_back() -> None:
    gate = Gate(4)
    for _ in range(4):
        gate.take()
    taken = threading.Event()
    waiter = threading.Thread(target=lambda: (gate.take(), taken.set()))
    waiter.start()
    gate.give()
    assert not taken.wait(0.2)  # one back of four: still waiting
    gate.give()
    assert taken.wait(5)  # two back: it takes one
    waiter.join(5)
    assert gate.available == 1
    gate.take()  # a free slot: no wait
    assert gate.available == 0


@pytest.mark.parametrize("make", [lambda: Tasks(0, "t"), lambda: Gate(0)])
def test_an_empty_pool_or_gate_is_refused(make: object) -> None:
    with pytest.raises(ValueError):
        make()  # type: ignore[operator]
