"""The weight sync: learner 0 puts the inference-only weights (no critic, rollout dtype) into the object store
once, the remote EnvRunner takes that object, and each iteration reports the bytes and seconds of the sync."""

from __future__ import annotations

import pytest
import ray
import torch

from gagpo_rllib.rllib.weight_sync import publish_weights, state_nbytes


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(address="local", num_cpus=3, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _spy_on_set_state(runner) -> None:
    """Record, on the runner, the name -> dtype of every module state it is given."""
    module = runner.module
    original = module.set_state
    runner.received = []

    def record(state):
        runner.received.append({k: str(v.dtype) for k, v in state.items()})
        return original(state)

    module.set_state = record


def test_ppo_in_bf16_ships_the_policy_only_once_from_learner_0(
    ray_cluster, tiny_maze_config, monkeypatch
) -> None:
    """A remote learner, a remote runner and a remote validation runner: both runners take learner 0's object."""
    from gagpo_rllib.rllib import weight_sync
    from gagpo_rllib.rllib.evaluation import EvalSettings, with_validation

    published_count = []
    publish = weight_sync.publish_weights

    def counting_publish(learner_group):
        published_count.append(1)
        return publish(learner_group)

    monkeypatch.setattr(weight_sync, "publish_weights", counting_publish)
    config = (
        tiny_maze_config(estimator="ppo", dtype="bfloat16")
        .learners(num_learners=1)
        .env_runners(num_env_runners=1)
    )
    config = with_validation(
        config, split="eval", interval=1, num_env_runners=1, settings=EvalSettings(num_tasks=1)
    )
    algo = config.build_algo()
    try:
        group = algo.env_runner_group
        group.foreach_env_runner(_spy_on_set_state, local_env_runner=False)
        algo.eval_env_runner_group.foreach_env_runner(_spy_on_set_state, local_env_runner=False)
        published_count.clear()

        def learner_side(learner):
            module = learner.module["default_policy"]
            state = module.state_dict()
            return (
                list(module.get_non_inference_attributes()),
                {k: v.numel() for k, v in state.items()},
                ray.get_runtime_context().get_worker_id(),
            )

        results = algo.learner_group.foreach_learner(learner_side)
        learner_only, numel, learner_worker = algo.learner_group._get_results(results)[0]
        critic = [k for k in numel if any(k.startswith(a + ".") for a in learner_only)]
        assert critic  # the learner does hold a critic, so leaving it out is a real check
        result = algo.train()
        received = group.foreach_env_runner(lambda r: r.received, local_env_runner=False)[0]
        assert len(received) == 1
        names = received[0]
        assert set(names) == set(numel) - set(critic)  # every policy tensor, no critic tensor
        assert set(names.values()) == {"torch.bfloat16"}
        policy_bytes = 2 * sum(n for k, n in numel.items() if k in names)
        gagpo = result["gagpo"]
        assert gagpo["weight_sync_bytes"] == policy_bytes
        assert gagpo["weight_sync_tensors"] == len(names) and gagpo["weight_sync_runners"] == 1.0
        assert gagpo["weight_sync_s"] > 0.0
        # The validation runner got the same weights through the same path (one more publication by learner 0).
        evaluated = algo.eval_env_runner_group.foreach_env_runner(
            lambda r: r.received, local_env_runner=False
        )
        assert evaluated[0] == [names] and result["evaluation"]["valid"]["num_episodes"] >= 1
        assert len(published_count) == 2

        # The object is learner 0's: put there, not a copy made by the driver.
        published = publish_weights(algo.learner_group)
        from ray.core.generated import common_pb2

        owner = common_pb2.Address()
        owner.ParseFromString(published.weights.refs[0].owner_address())
        assert owner.worker_id.hex() == learner_worker
        assert published.nbytes == policy_bytes
    finally:
        algo.stop()


def test_state_nbytes_counts_tensors_and_arrays_in_nested_states() -> None:
    import numpy as np

    state = {"a": torch.zeros(3, 4, dtype=torch.bfloat16), "b": {"c": np.zeros(5, dtype=np.float32)}, "n": 3}
    assert state_nbytes(state) == (3 * 4 * 2 + 5 * 4, 2)


def test_packed_weights_reach_another_process_bit_for_bit_in_the_rollout_dtype(ray_cluster) -> None:
    """Several buckets put by one process, read lazily in another: every tensor equals the sender's cast."""
    import pickle

    from gagpo_rllib.rllib.weight_sync import PackedWeights, publish_tensors

    gen = torch.Generator().manual_seed(3)
    named = [(f"layers.{i}.weight", torch.randn(64, 48, generator=gen)) for i in range(6)]
    named.append(("positions", torch.arange(10)))
    packed = publish_tensors(named, torch.bfloat16, bucket_bytes=16 << 10, threads=2)
    assert len(packed.buckets) >= 3 and len(packed) == len(named)
    assert len(pickle.dumps(packed)) < 8 << 10  # references and layout only, never the bytes

    @ray.remote
    def read(weights: PackedWeights, name: str) -> tuple[dict, torch.Tensor]:
        return {k: v.clone() for k, v in weights.items()}, weights[name].clone()

    received, single = ray.get(read.remote(packed, "layers.2.weight"))
    assert list(received) == [n for n, _ in named]
    for name, t in named:
        expected = t.to(torch.bfloat16) if t.is_floating_point() else t
        assert received[name].dtype == expected.dtype and torch.equal(received[name], expected), name
    assert torch.equal(single, named[2][1].to(torch.bfloat16))


def _record_engine_loads(runner) -> None:
    """Record, on the runner, every (name, tensor) its vLLM engine is handed by a sync (copies)."""
    backend = runner.module.backend
    original = backend.update_weights
    runner.engine_loads = []

    def record(named):
        pairs = [(name, t) for name, t in (named.items() if hasattr(named, "items") else named)]
        runner.engine_loads.append(
            {name: backend_tensor.clone() for name, backend_tensor in backend._weights(pairs)}
        )
        return original(pairs)

    backend.update_weights = record


@pytest.mark.parametrize(
    ("case", "setup"),
    [
        ("hf, 2 runners", dict(runners=2, gagpo={})),
        ("hf, LoRA merged", dict(runners=1, gagpo={"lora_rank": 2})),
        ("hf, 2 FSDP learners", dict(runners=1, learners=2, gagpo={"learner_sharding": "fsdp"})),
        pytest.param(
            "vllm, 1 runner",
            dict(runners=1, gagpo={"backend": "vllm", "max_prompt_tokens": 600}),
            marks=pytest.mark.vllm_engine,
        ),
        # The broadcast channel (gloo on CPU, the code NCCL runs on GPUs): a remote and a local learner 0.
        ("hf, 2 runners, broadcast", dict(runners=2, learners=1, gagpo={}, transport="broadcast")),
        ("hf, local learner, broadcast", dict(runners=1, gagpo={}, transport="broadcast")),
        (
            "hf, 2 FSDP learners, broadcast",
            dict(runners=1, learners=2, gagpo={"learner_sharding": "fsdp"}, transport="broadcast"),
        ),
        pytest.param(
            "vllm, 2 runners, broadcast",
            dict(
                runners=2,
                gagpo={"backend": "vllm", "max_prompt_tokens": 600},
                transport="broadcast",
            ),
            marks=pytest.mark.vllm_engine,
        ),
        # Shared buckets (shared-memory files on CPU, the protocol CUDA IPC handles run on GPUs): every runner is on
        # learner 0's device (this host).
        ("hf, 2 runners, ipc", dict(runners=2, learners=1, gagpo={}, transport="ipc")),
        (
            "hf, 2 FSDP learners, ipc",
            dict(runners=1, learners=2, gagpo={"learner_sharding": "fsdp"}, transport="ipc"),
        ),
        pytest.param(
            "vllm, 1 runner, local learner, ipc",
            dict(runners=1, gagpo={"backend": "vllm", "max_prompt_tokens": 600}, transport="ipc"),
            marks=pytest.mark.vllm_engine,
        ),
    ],
)
def test_what_the_runners_load_is_the_learners_weights_in_the_rollout_dtype_bit_for_bit(
    ray_cluster, tiny_maze_config, case: str, setup: dict, request
) -> None:
    """After an update, every runner holds (HF) or is handed (the real vLLM CPU engine) exactly the learner's
    inference weights cast to bfloat16, through several buckets, by the object store, the broadcast channel or
    shared buckets; the iteration reports which, and that no channel sync fell back."""
    from gagpo_rllib.rllib import weight_sync
    from gagpo_rllib.rllib.rllib_internals import on_first_learner

    if setup["gagpo"].get("backend") == "vllm":
        request.getfixturevalue("real_vllm")  # skipped where vLLM is not installed, unless required
    config = tiny_maze_config(dtype="bfloat16", **setup["gagpo"]).env_runners(
        num_env_runners=setup["runners"]
    )
    if setup.get("learners"):
        config = config.learners(num_learners=setup["learners"])
    transport = setup.get("transport", "object_store")
    config = config.learners(weight_transport=transport)
    algo = config.build_algo()
    try:
        group = algo.env_runner_group
        vllm = setup["gagpo"].get("backend") == "vllm"
        if vllm:
            group.foreach_env_runner(_record_engine_loads, local_env_runner=False)

        def expected(learner):
            module = learner.module["default_policy"].unwrapped()
            return {
                k.removeprefix("model."): v.to(torch.bfloat16).cpu() for k, v in module.inference_tensors()
            }

        def small_buckets(learner):
            weight_sync.BUCKET_BYTES = 256 << 10  # several buckets on the tiny policy
            return True

        if algo.learner_group.is_local:
            small_buckets(None)
        else:
            algo.learner_group.foreach_learner(small_buckets)
        result = algo.train()
        assert result["gagpo"]["weight_sync_broadcast"] == float(transport == "broadcast"), case
        assert result["gagpo"]["weight_sync_ipc"] == float(transport == "ipc"), case
        assert result["gagpo"]["weight_sync_fallbacks"] == 0.0, case
        if algo.learner_group.is_local:
            want = expected(algo.learner_group._learner)
        else:  # learner 0 serves the weights (under FSDP the only one holding them whole)
            if setup["gagpo"].get("learner_sharding") == "fsdp":
                # The sync gathered bucket by bucket: no learner keeps a whole copy of the model after it.
                holds = algo.learner_group.foreach_learner(
                    lambda learner: learner.module["default_policy"].unwrapped()._gathered is None
                )
                assert all(r.get() for r in holds)
                algo.learner_group.foreach_learner(lambda learner: learner.gather_full_state())
            want = on_first_learner(algo.learner_group, expected)
        if vllm:
            held = group.foreach_env_runner(lambda r: r.engine_loads[-1], local_env_runner=False)
        else:
            held = group.foreach_env_runner(
                lambda r: {k: v.clone() for k, v in r.module.model.state_dict().items()},
                local_env_runner=False,
            )
        assert len(held) == setup["runners"]
        for runner_state in held:
            assert set(want) <= set(runner_state), case
            for name, value in want.items():
                got = runner_state[name]
                assert got.dtype == torch.bfloat16 and torch.equal(got, value), (case, name)
    finally:
        weight_sync.BUCKET_BYTES = weight_sync.DEFAULT_BUCKET_BYTES
        algo.stop()


def _runner_weights(group) -> dict:
    """The first remote runner's model weights, as it holds them."""
    return group.foreach_env_runner(
        lambda r: {k: v.clone() for k, v in r.module.model.state_dict().items()}, local_env_runner=False
    )[0]


def _learner_weights(algo) -> dict:
    """The local learner's inference weights in bf16, named as a runner's model names them."""
    module = algo.learner_group._learner.module["default_policy"].unwrapped()
    return {k.removeprefix("model."): v.to(torch.bfloat16) for k, v in module.inference_tensors()}


@pytest.mark.parametrize("transport", ["broadcast", "ipc"])
def test_a_failed_channel_sync_is_counted_served_by_the_object_store_and_the_channel_opened_again(
    ray_cluster, tiny_maze_config, monkeypatch, transport: str
) -> None:
    """The runner leaves the channel behind learner 0's back: that iteration's sync fails over to the object store
    (logged, ``weight_sync_fallbacks`` 1) and still delivers learner 0's weights; the next one opens a new channel
    and syncs over it again (broadcast, or shared buckets). A learner 0 that lost its channel gets a new one before the runners wait. A group with
    ``BROADCAST_MAX_FAILURES`` failures in a row stays on the object store."""
    from gagpo_rllib.policy.weight_transport import close_channel
    from gagpo_rllib.rllib import weight_sync

    monkeypatch.setattr(weight_sync, "BROADCAST_TIMEOUT_S", 20.0)
    config = tiny_maze_config(dtype="bfloat16").env_runners(num_env_runners=1)
    algo = config.learners(weight_transport=transport).build_algo()
    used = f"weight_sync_{transport}"
    try:
        group = algo.env_runner_group

        def leave(g):
            name = weight_sync._GROUP_CHANNELS[g].links[0].info.name
            g.foreach_env_runner(lambda r: close_channel(name), local_env_runner=False)

        assert algo.train()["gagpo"][used] == 1.0  # the first sync opens the channel
        leave(group)
        result = algo.train()
        assert result["gagpo"]["weight_sync_fallbacks"] == 1.0
        assert result["gagpo"][used] == 0.0
        runner, want = _runner_weights(group), _learner_weights(algo)
        assert all(torch.equal(runner[k], v) for k, v in want.items())

        result = algo.train()
        assert result["gagpo"][used] == 1.0
        assert result["gagpo"]["weight_sync_fallbacks"] == 1.0  # a lifetime count
        runner, want = _runner_weights(group), _learner_weights(algo)
        assert all(torch.equal(runner[k], v) for k, v in want.items())

        assert weight_sync._GROUP_CHANNELS[group].failures == 0  # a success resets the count

        # Learner 0 (the driver's local learner here) without its channel, as a restarted learner is: the sync
        # sees it before any runner waits and opens a new channel, no fallback.
        old = weight_sync._GROUP_CHANNELS[group].links[0].info.name
        close_channel(old)
        result = algo.train()
        assert result["gagpo"][used] == 1.0
        assert result["gagpo"]["weight_sync_fallbacks"] == 1.0
        assert weight_sync._GROUP_CHANNELS[group].links[0].info.name != old
        weight_sync._GROUP_CHANNELS[group].failures = weight_sync.BROADCAST_MAX_FAILURES
        report = weight_sync.sync_env_runners(group, algo.learner_group)
        assert report.transport == "object_store" and not report.fallback
    finally:
        algo.stop()


@pytest.mark.parametrize("transport", ["broadcast", "ipc"])
def test_a_runner_killed_and_restored_gets_a_new_channel_without_a_fallback(
    ray_cluster, tiny_maze_config, monkeypatch, transport: str
) -> None:
    """A runner SIGKILLed between iterations comes back as a new process in no channel; RLlib's restore (through
    the Algorithm) makes the next channel sync open new channels first, so it neither waits out the channel's
    timeout nor falls back to the object store, and the new process holds learner 0's weights."""
    import os
    import signal

    from gagpo_rllib.rllib import weight_sync

    monkeypatch.setattr(weight_sync, "BROADCAST_TIMEOUT_S", 20.0)
    config = (
        tiny_maze_config(dtype="bfloat16")
        .env_runners(num_env_runners=1)
        .fault_tolerance(delay_between_env_runner_restarts_s=0.5)
    )
    algo = config.learners(weight_transport=transport).build_algo()
    used = f"weight_sync_{transport}"
    try:
        group = algo.env_runner_group

        def pid() -> int:
            return group.foreach_env_runner(lambda r: os.getpid(), local_env_runner=False)[0]

        assert algo.train()["gagpo"][used] == 1.0
        old_pid, old_channel = pid(), weight_sync._GROUP_CHANNELS[group].links[0].info.name
        os.kill(old_pid, signal.SIGKILL)
        restored, results = 0.0, []
        # The kill is seen by a sampling call; RLlib restores the runner in that iteration.
        while not restored:
            assert len(results) < 3, "the killed runner was not restored"
            results.append(algo.train())
            restored = results[-1]["gagpo"]["env_runners_restored"]
        assert restored == 1.0 and pid() != old_pid
        assert results[-1]["gagpo"][used] == 1.0 and results[-1]["gagpo"]["weight_sync_fallbacks"] == 0.0
        assert weight_sync._GROUP_CHANNELS[group].links[0].info.name != old_channel
        runner, want = _runner_weights(group), _learner_weights(algo)
        assert all(torch.equal(runner[k], v) for k, v in want.items())
    finally:
        algo.stop()


def test_ipc_pairs_each_runner_with_the_lowest_ranked_learner_on_its_device() -> None:
    from gagpo_rllib.rllib.weight_sync import pair_by_device

    learners = {0: "cuda:a", 1: "cuda:b", 2: "cuda:b"}
    runners = {1: "cuda:b", 2: "cuda:a", 3: "cuda:c", 4: "cuda:b"}
    assert pair_by_device(learners, runners) == ({0: (2,), 1: (1, 4)}, (3,))
    assert pair_by_device({0: "host:x"}, {}) == ({}, ())
