"""torch's thread count on EnvRunners and Learners follows the CPUs Ray gave them, or the config's override."""

from __future__ import annotations

import pytest
import ray
import torch

from gagpo_rllib import GAGPOConfig
from gagpo_rllib.rllib.threads import set_torch_threads


@pytest.fixture
def keep_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_driver_process_gets_the_main_process_share(keep_threads) -> None:
    torch.set_num_threads(2)
    config = GAGPOConfig()
    assert config.num_cpus_for_main_process == 1
    assert set_torch_threads(config, "test") == 1 and torch.get_num_threads() == 1
    config.env_runners(torch_threads=3)
    assert set_torch_threads(config, "test") == 3 and torch.get_num_threads() == 3
    with pytest.raises(ValueError, match="torch_threads"):
        GAGPOConfig().env_runners(torch_threads=0).validate_gagpo()


def test_remote_runner_and_local_learner_set_their_threads(tiny_maze_config, keep_threads) -> None:
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        # The override on a remote EnvRunner (1 CPU from Ray) and on the learner in this process.
        torch.set_num_threads(1)
        config = tiny_maze_config(torch_threads=2).env_runners(num_env_runners=1, num_cpus_per_env_runner=1)
        algo = config.build_algo()
        try:
            remote = algo.env_runner_group.foreach_env_runner(
                lambda r: r.torch_threads(), local_env_runner=False
            )
            assert remote == [2]
            assert torch.get_num_threads() == 2
        finally:
            algo.stop()
        # Without it: the CPUs Ray gave each actor (1 for the runner; the driver's main-process share).
        torch.set_num_threads(2)
        algo = tiny_maze_config().env_runners(num_env_runners=1, num_cpus_per_env_runner=1).build_algo()
        try:
            remote = algo.env_runner_group.foreach_env_runner(
                lambda r: r.torch_threads(), local_env_runner=False
            )
            assert remote == [1]
            assert torch.get_num_threads() == 1
        finally:
            algo.stop()
    finally:
        ray.shutdown()
