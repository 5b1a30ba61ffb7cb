"""Rollouts overlapped with the update (``max_staleness`` = k >= 1): the runners play the next iterations' groups
while the learners update on this one.

One worker thread in the driver runs the rollout jobs in iteration order; a job is "hand the runners the newest
published weights (if any), then play iteration j's plan". At the start of iteration i the driver publishes the
weights of the last update (the learners are idle then) and queues the jobs up to iteration i + k; it then waits for
iteration i's episodes and updates on them while the thread plays i + 1, ... So iteration j is played with the
weights of update j - k or later, and the update that trains on it starts from the weights of update j: at most
k updates of staleness, exactly k in the steady state. The first k iterations play with the initial weights.

The driver's metrics are logged on the driver's thread only; a job returns what it measured. With no remote
EnvRunner (the local runner samples in the driver's process) the jobs run inline when queued, in the same order,
so the episodes and their staleness are the same as with remote runners, without the overlap.

A checkpoint holds no job in flight: a restored run plans the iterations after it again from their seeds (the
plan of an iteration is a function of the seed and the iteration), so no group is lost or played twice; those
iterations then play with the restored weights.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

__all__ = ["RolloutPipeline", "SampledIteration"]

logger = logging.getLogger(__name__)


@dataclass
class SampledIteration:
    """One iteration's episodes, how they were played and with which weights."""

    iteration: int
    sample: Any  # GroupSample
    dynamic: Any  # DynamicSample or None
    sample_s: float
    weights_version: int  # updates the runners' weights held when this iteration started playing
    sync: Any = None  # the SyncReport of the weights handed over just before it (None: no new weights)


class RolloutPipeline:
    """The driver's queue of rollout jobs (see the module docstring)."""

    def __init__(self, sample: Callable[[int], tuple[Any, Any, float]], *, overlap: bool) -> None:
        self._sample = sample
        self._executor = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="gagpo-rollouts") if overlap else None
        )
        self._jobs: dict[int, Future] = {}
        self._next = None  # the next iteration to queue
        self._deliver: Callable[[], Any] | None = None
        self._deliver_version = 0
        self._runner_version = 0  # updates in the weights the runners hold (as the jobs run)

    def publish(self, deliver: Callable[[], Any], version: int) -> None:
        """Weights of ``version`` updates, published by the learners: the next queued job hands them over."""
        self._deliver, self._deliver_version = deliver, int(version)

    def queue_until(self, last: int, start: int) -> None:
        """Queue the jobs of iterations up to ``last`` (from ``start`` when nothing was queued yet)."""
        if self._next is None:
            self._next = int(start)
        while self._next <= last:
            job = self._job(self._next, self._deliver, self._deliver_version)
            self._deliver = None
            if self._executor is None:
                done: Future = Future()
                try:
                    done.set_result(job())
                except BaseException as err:  # noqa: BLE001 - re-raised where the driver waits for it
                    done.set_exception(err)
                self._jobs[self._next] = done
            else:
                self._jobs[self._next] = self._executor.submit(job)
            self._next += 1

    def _job(
        self, iteration: int, deliver: Callable[[], Any] | None, version: int
    ) -> Callable[[], SampledIteration]:
        def run() -> SampledIteration:
            sync = None
            if deliver is not None:
                sync = deliver()
                self._runner_version = version
            weights_version = self._runner_version
            sample, dynamic, sample_s = self._sample(iteration)
            return SampledIteration(iteration, sample, dynamic, sample_s, weights_version, sync)

        return run

    def take(self, iteration: int) -> SampledIteration:
        """Wait for iteration ``iteration``'s episodes (queued before)."""
        job = self._jobs.pop(iteration, None)
        if job is None:
            raise RuntimeError(f"iteration {iteration} was not queued (queued: {sorted(self._jobs)})")
        return job.result()

    def in_flight(self) -> list[int]:
        """Iterations queued and not yet taken."""
        return sorted(self._jobs)

    def close(self) -> None:
        """Wait for the running job (Ray calls cannot be cancelled mid-flight) and drop the queued ones."""
        if self._executor is not None:
            start = time.perf_counter()
            for job in self._jobs.values():
                job.cancel()
            self._executor.shutdown(wait=True, cancel_futures=True)
            logger.debug("rollout pipeline closed in %.1f s", time.perf_counter() - start)
        self._jobs.clear()
