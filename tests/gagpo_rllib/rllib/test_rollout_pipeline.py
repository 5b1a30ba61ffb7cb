"""The rollout pipeline of ``max_staleness``: which weights each iteration is played with, in which order."""

from __future__ import annotations

import threading

import pytest

from gagpo_rllib.rllib.rollout_pipeline import RolloutPipeline


class _Runners:
    """Records which weights version each iteration was played with (the pipeline is what is under test)."""

    def __init__(self) -> None:
        self.version = 0
        self.log: list[tuple[str, int]] = []
        self.threads: set[str] = set()

    def deliver(self, version: int):
        def run() -> str:
            self.version = version
            self.log.append(("sync", version))
            return f"sync {version}"

        return run

    def sample(self, iteration: int):
        self.threads.add(threading.current_thread().name)
        self.log.append(("play", iteration))
        return f"episodes {iteration}", None, 0.0


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("k", [1, 2])
def test_iteration_j_plays_with_the_weights_of_update_j_minus_k(overlap: bool, k: int) -> None:
    runners = _Runners()
    pipeline = RolloutPipeline(runners.sample, overlap=overlap)
    staleness, synced = [], []
    try:
        for i in range(6):  # the driver's loop: publish the last update, queue up to i + k, take i, update
            if i > 0:
                pipeline.publish(runners.deliver(i), i)
            pipeline.queue_until(i + k, start=i)
            sampled = pipeline.take(i)
            assert sampled.sample == f"episodes {i}" and sampled.iteration == i
            staleness.append(i - sampled.weights_version)
            synced.append(sampled.sync)
    finally:
        pipeline.close()
    assert staleness == [min(i, k) for i in range(6)]
    # The first k + 1 iterations play with the initial weights; then each sync goes right before the play queued
    # with it (update i's weights before iteration i + k). Jobs queued beyond iteration 5 may have run before
    # close() dropped the rest.
    want = [("play", j) for j in range(k + 1)]
    for i in range(1, 6):
        want += [("sync", i), ("play", i + k)]
    taken = want.index(("play", 5)) + 1
    assert len(runners.log) >= taken and runners.log == want[: len(runners.log)]
    assert synced == [f"sync {i - k}" if i > k else None for i in range(6)]
    assert (runners.threads == {"MainThread"}) == (not overlap)


def test_an_iteration_not_queued_is_an_error() -> None:
    pipeline = RolloutPipeline(_Runners().sample, overlap=False)
    pipeline.queue_until(0, start=0)
    with pytest.raises(RuntimeError, match="iteration 3 was not queued"):
        pipeline.take(3)
    assert pipeline.in_flight() == [0]
    pipeline.close()
    assert pipeline.in_flight() == []


def test_a_failing_rollout_raises_where_the_driver_waits() -> None:
    def fail(iteration: int):
        raise ValueError(f"env broke in {iteration}")

    for overlap in (False, True):
        pipeline = RolloutPipeline(fail, overlap=overlap)
        pipeline.queue_until(1, start=0)
        with pytest.raises(ValueError, match="env broke in 0"):
            pipeline.take(0)
        pipeline.close()
