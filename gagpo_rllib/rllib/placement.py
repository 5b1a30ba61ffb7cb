"""Whether a config's learners and EnvRunners can be placed on the running cluster: CPU and GPU checks made
before anything starts (``GAGPOConfig.validate``, ``GAGPO.default_resource_request``), so a run that cannot be
placed fails with the numbers instead of waiting forever for resources."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

__all__ = [
    "cluster_capacity",
    "gpu_placement_problem",
    "placement_shortfall",
    "resource_shortfall",
]


def cluster_capacity() -> tuple[float, float, str] | None:
    """(CPUs, GPUs, where) of the running Ray cluster, else of this machine (what ``ray.init()`` would find);
    None when ``RAY_ADDRESS`` points at a cluster not joined yet."""
    import ray

    if ray.is_initialized():
        total = ray.cluster_resources()
        return float(total.get("CPU", 0)), float(total.get("GPU", 0)), "the Ray cluster"
    if os.environ.get("RAY_ADDRESS"):
        return None
    import torch

    gpus = float(torch.cuda.device_count() if torch.cuda.is_available() else 0)
    return float(os.cpu_count() or 1), gpus, "this machine"


def _evaluation_runners(config: Any) -> tuple[int, float, float, str | None]:
    """(evaluation EnvRunners, GPUs each, CPUs each, their backend); (0, 0, 0, None) without evaluation."""
    if getattr(config, "in_evaluation", False) or not config.evaluation_interval:
        return 0, 0.0, 0.0, None
    overrides = config.evaluation_config
    overrides = overrides.to_dict() if hasattr(overrides, "to_dict") else dict(overrides or {})

    def field(name: str) -> Any:
        return overrides.get(name, getattr(config, name))

    return (
        int(config.evaluation_num_env_runners or 0),
        float(field("num_gpus_per_env_runner") or 0),
        float(field("num_cpus_per_env_runner") or 0),
        field("backend"),
    )


def resource_shortfall(config: Any) -> str | None:
    """Why the learners, EnvRunners and evaluation EnvRunners asked for cannot be placed, or None.

    Compared with the Ray cluster's totals when Ray runs, else with this machine; skipped when ``RAY_ADDRESS``
    points at a cluster not joined yet. Actors that cannot be placed would otherwise wait forever.
    """
    capacity = cluster_capacity()
    if capacity is None:
        return None
    have_cpu, have_gpu, where = capacity
    n_learners, n_runners = int(config.num_learners), int(config.num_env_runners)
    n_eval, eval_gpu, eval_cpu, _ = _evaluation_runners(config)
    gpu_per_learner = float(config.num_gpus_per_learner or 0)
    cpu_per_learner = config.num_cpus_per_learner
    if cpu_per_learner == "auto":
        cpu_per_learner = 1 if gpu_per_learner == 0 else 0
    gpu_per_runner = float(config.num_gpus_per_env_runner or 0)
    want_gpu = n_learners * gpu_per_learner + n_runners * gpu_per_runner + n_eval * eval_gpu
    want_cpu = (
        n_learners * float(cpu_per_learner)
        + n_runners * float(config.num_cpus_per_env_runner or 0)
        + n_eval * eval_cpu
    )
    per_runner_cpu = float(config.num_cpus_per_env_runner or 0)
    for kind, want, have, learner, runner, per_eval in (
        ("GPU", want_gpu, have_gpu, gpu_per_learner, gpu_per_runner, eval_gpu),
        ("CPU", want_cpu, have_cpu, float(cpu_per_learner), per_runner_cpu, eval_cpu),
    ):
        if want > have + 1e-9:
            unit = kind.lower()
            evaluation = f" + evaluation_num_env_runners={n_eval} x {per_eval:g}" if n_eval else ""
            return (
                f"num_learners={n_learners} x num_{unit}s_per_learner={learner:g} + num_env_runners={n_runners}"
                f" x num_{unit}s_per_env_runner={runner:g}{evaluation} asks for {want:g} {kind}s; {where} has"
                f" {have:g}"
            )
    return None


def gpu_placement_problem(config: Any) -> str | None:
    """What in the GPU layout would fail at run time, with the fix, or None.

    - NCCL learners sharing a GPU: with two or more learners on GPUs each needs more than half of one (Ray packs
      fractional learners onto one device, and NCCL refuses two ranks on the same GPU); over half, a learner shares
      its GPU with EnvRunners only (the colocated plan of ``paper_setup``).
    - vLLM engines only where a GPU is reserved: the training rollouts need remote EnvRunners (a local runner is
      in the driver's or the Algorithm's process), validation needs its own evaluation EnvRunners, and on a
      cluster with GPUs every such runner needs a GPU share (else the engine starts on cuda:0, someone else's).
    """
    n_learners = int(config.num_learners)
    gpu_per_learner = float(config.num_gpus_per_learner or 0)
    if n_learners >= 2 and 0 < gpu_per_learner <= 0.5:
        return (
            f"num_learners={n_learners} with num_gpus_per_learner={gpu_per_learner:g}: NCCL needs a GPU per"
            " learner (Ray would put two learners on one GPU and NCCL refuses that); set num_gpus_per_learner=1"
            " and give the EnvRunners the GPUs that are left, or a share over 0.5 with the EnvRunners beside the"
            " learners (paper_setup's colocated plan)"
        )
    in_eval = bool(getattr(config, "in_evaluation", False))
    capacity = cluster_capacity()
    have_gpu = capacity[1] if capacity is not None else 0.0
    # An evaluation config object is validated by RLlib even when no evaluation runs (it keeps the interval).
    if config.backend == "vllm" and not (in_eval and not config.evaluation_interval):
        runners = "evaluation_num_env_runners" if in_eval else "num_env_runners"
        if int(config.num_env_runners) < 1:
            return (
                f"{runners}=0 with backend 'vllm': the engine would run in the "
                f"{'evaluation group' if in_eval else 'driver'}'s local EnvRunner, in the driver's or the Algorithm's"
                f" process, which holds no GPU for it; set {runners} >= 1 (with num_gpus_per_env_runner)"
            )
        if have_gpu > 0 and float(config.num_gpus_per_env_runner or 0) <= 0:
            return (
                f"{runners}={config.num_env_runners} with num_gpus_per_env_runner=0 and backend 'vllm' on a"
                f" cluster with {have_gpu:g} GPUs: each engine would start on cuda:0, a GPU reserved for someone"
                " else; give the EnvRunners a GPU share (num_gpus_per_env_runner)"
            )
    n_eval, eval_gpu, _, eval_backend = _evaluation_runners(config)
    if eval_backend == "vllm":
        if n_eval < 1:
            return (
                "evaluation_num_env_runners=0 with backend 'vllm' and evaluation_interval set: validation would"
                " start a vLLM engine in the Algorithm's process, which holds no GPU; set"
                " evaluation_num_env_runners=1 (gagpo_rllib.rllib.evaluation.with_validation does with backend 'vllm')"
            )
        if have_gpu > 0 and eval_gpu <= 0:
            return (
                f"evaluation_num_env_runners={n_eval} with num_gpus_per_env_runner=0 for evaluation and backend"
                f" 'vllm' on a cluster with {have_gpu:g} GPUs: give the evaluation runners a GPU share"
                " (evaluation_config num_gpus_per_env_runner)"
            )
    return None


def placement_shortfall(bundles: Sequence[dict[str, float]]) -> str | None:
    """Why a trial's placement bundles exceed the running Ray cluster, or None (also when Ray is not running).

    Tune would otherwise keep the trial pending forever; its request includes a bundle for the driver.
    """
    import ray

    if not ray.is_initialized():
        return None
    total = ray.cluster_resources()
    for resource in ("CPU", "GPU"):
        want = sum(float(b.get(resource, 0)) for b in bundles)
        have = float(total.get(resource, 0))
        if want > have + 1e-9:
            return (
                f"the trial asks for {want:g} {resource}s in {len(bundles)} bundles (driver, learners, EnvRunners);"
                f" the Ray cluster has {have:g}"
            )
    return None
