"""The output stage runs jobs in order, one deep, and reports a failed job."""

from __future__ import annotations

import threading
import time

import pytest

from sealstream._runtime.output import OutputStage


@pytest.mark.parametrize("concurrent", [True, False])
def test_jobs_run_in_order_one_at_a_time(concurrent: bool) -> None:
    stage = OutputStage(concurrent)
    done: list[int] = []
    running = threading.Semaphore(1)

    def job(i: int) -> None:
        assert running.acquire(blocking=False), "two jobs at once"
        time.sleep(0.002)
        done.append(i)
        running.release()

    for i in range(20):
        stage.submit(lambda i=i: job(i))
        # one deep: everything before the job just submitted has finished
        # (inline, the job itself too)
        assert done[:i] == list(range(i))
        assert len(done) == i + 1 if not concurrent else len(done) in (i, i + 1)
    stage.drain()
    assert done == list(range(20))
    stage.close()


def test_a_background_job_runs_on_another_thread() -> None:
    stage = OutputStage(True)
    seen: list[threading.Thread] = []
    stage.submit(lambda: seen.append(threading.current_thread()))
    stage.drain()
    assert seen and seen[0] is not threading.current_thread()
    stage.close()


def test_a_failed_job_is_reported_by_the_next_submit_and_not_twice() -> None:
    stage = OutputStage(True)

    def fail() -> None:
        raise OSError("disk full")

    stage.submit(fail)
    ran: list[int] = []
    with pytest.raises(OSError, match="disk full"):
        stage.submit(lambda: ran.append(1))
    assert ran == []  # the job after a failure never ran
    stage.drain()  # the failure was reported once
    stage.close()


def test_a_failed_job_is_reported_by_drain() -> None:
    stage = OutputStage(True)
    stage.submit(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        stage.drain()
    stage.close()


def test_close_waits_for_the_job_and_swallows_its_failure() -> None:
    stage = OutputStage(True)
    done: list[int] = []

    def slow() -> None:
        time.sleep(0.05)
        done.append(1)
        raise ValueError("reported elsewhere")

    stage.submit(slow)
    stage.close()
    assert done == [1]
