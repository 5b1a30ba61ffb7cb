"""The GAGPO Algorithm: grouped rollouts of an LLM policy, critic-free grouped advantages (config: ``config.py``).

One iteration: the driver draws N task instances from the env's split (deterministic from the seed and the
iteration), plans K episodes of each (a group), hands the groups to the EnvRunners, which play every planned
episode to its end; the Learner turns the episodes into step advantages (``compute_advantages``) and updates the
policy; the new weights go to the rollout backends. With ``max_staleness`` >= 1 the runners play the next
iterations while the learners update (``take_rollout``, ``gagpo_rllib.rllib.rollout_pipeline``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import defaultdict
from typing import Any

import numpy as np
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.utils.metrics import (
    ENV_RUNNER_RESULTS,
    ENV_RUNNER_SAMPLING_TIMER,
    LEARNER_RESULTS,
    LEARNER_UPDATE_TIMER,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    SYNCH_WORKER_WEIGHTS_TIMER,
    TIMERS,
)

from envs.protocol import outcome
from gagpo_rllib.columns import Columns
from gagpo_rllib.rllib.checkpoints import write_version
from gagpo_rllib.rllib.config import GAGPOConfig
from gagpo_rllib.rllib.engine_sleep import rollout_engines_asleep
from gagpo_rllib.rllib.env_runner import PlannedEpisode, RolloutStats
from gagpo_rllib.rllib.group_sampling import (
    EXTRA_GROUP_ID_BASE,
    GroupSample,
    ask_env_runner,
    extra_plan,
    sample_whole_groups,
    split_plan,
    task_plan,
)
from gagpo_rllib.rllib.groups import (
    DynamicSample,
    GroupShardedTrainingData,
    TrainingGroups,
    fill_informative_groups,
    reward_signal_shares,
    stamp_training_groups,
)
from gagpo_rllib.rllib.learner import NONFINITE_SKIPPED
from gagpo_rllib.rllib.placement import placement_shortfall
from gagpo_rllib.rllib.rollout_pipeline import RolloutPipeline
from gagpo_rllib.rllib.weight_sync import (
    SyncReport,
    close_weight_channels,
    prepare_sync,
    route_learner_syncs,
    runners_left_channels,
    sync_env_runners,
    write_rollout_weights,
)

__all__ = ["GAGPO", "GAGPOConfig", "split_plan"]

logger = logging.getLogger(__name__)


def _process_engines() -> int:
    """vLLM engines this process has started (0 when the vLLM backend was never imported)."""
    import sys

    vllm_backend = sys.modules.get("gagpo_rllib.policy.generation.vllm")
    return vllm_backend.engines_started() if vllm_backend is not None else 0


class GAGPO(Algorithm):
    """Samples N x K grouped episodes per iteration on the EnvRunners, updates with GAGPO, syncs weights."""

    @classmethod
    def get_default_config(cls) -> GAGPOConfig:
        return GAGPOConfig()

    @classmethod
    def default_resource_request(cls, config):
        """RLlib's placement request for Tune, refused when the running cluster cannot hold it (never pending)."""
        request = super().default_resource_request(config)
        shortfall = placement_shortfall(request.bundles)
        if shortfall:
            raise ValueError(
                f"GAGPOConfig.num_learners / num_env_runners cannot be placed: {shortfall}; ask for less, or start"
                " Ray with more (rllib train file --num-cpus N)"
            )
        return request

    def setup(self, config) -> None:
        """RLlib's set-up; then every sync RLlib itself makes from the learners (after a restore, before a
        validation, to restored runners) goes through ``gagpo_rllib.rllib.weight_sync`` too: one object-store copy
        put by learner 0 (under FSDP gathered bucket by bucket), not one through the driver."""
        # Engines this process started before this Algorithm (another run in the same process) are not its own.
        self._engines_before = _process_engines()
        # max_staleness >= 1: the rollout jobs (started on first use), the updates in the learners' weights and
        # the number of them last published to the runners.
        self._pipeline: RolloutPipeline | None = None
        self._updates = self._published_updates = 0
        # A validation playing beside training (``evaluation.BackgroundValidation``, with_validation(background=True)).
        self.background_validation = None
        # Steps the model needs before it loads (on_setup_start, e.g. a cached warm start).
        config.run_setup_start()
        super().setup(config)
        if config.shards_learners:  # gathered for RLlib's first sync
            self.learner_group.foreach_learner(lambda learner: learner.release_full_state())
        if self.learner_group is not None:
            route_learner_syncs(self.env_runner_group, self.learner_group)
            evaluation = getattr(self, "eval_env_runner_group", None)
            if evaluation is not None and evaluation is not self.env_runner_group:
                # A validation playing in the background keeps its weights; the next one gets the newest.
                route_learner_syncs(evaluation, self.learner_group, skip=self.validation_busy)

    def validation_busy(self) -> bool:
        """Whether a background validation is playing on the evaluation runners (``evaluation.BackgroundValidation``)."""
        return self.background_validation is not None and self.background_validation.busy()

    def restore_env_runners(self, env_runner_group) -> list[int]:
        """RLlib's restore, which syncs restored runners from the local runner; that one holds no weights when
        remote runners sample (``gagpo_rllib.rllib.weight_sync``), so learner 0's weights follow."""
        restored = super().restore_env_runners(env_runner_group)
        if not restored:
            return restored
        # New processes, in none of the group's weight channels: the next channel sync opens new ones.
        runners_left_channels(env_runner_group, list(restored))
        if self.learner_group is not None:
            sync_env_runners(env_runner_group, self.learner_group, worker_ids=list(restored), force=True)
        if env_runner_group is self.env_runner_group:
            # A runner lost between sampling calls (e.g. killed during the update) is only seen here.
            self.metrics.log_value(("gagpo", "env_runners_restored"), float(len(restored)), reduce="sum")
        return restored

    def num_tasks(self) -> int:
        if getattr(self, "_num_tasks", None) is None:
            self._num_tasks = int(ask_env_runner(self, lambda r: r.num_tasks()))
        return self._num_tasks

    def iteration_plan(self, iteration: int) -> list[PlannedEpisode]:
        cfg = self.config
        return task_plan(
            self.num_tasks(),
            groups=cfg.groups_per_iteration,
            group_size=cfg.group_size,
            seed=cfg.seed or 0,
            iteration=iteration,
        )

    def sample_dynamic(self, first: GroupSample, iteration: int) -> DynamicSample:
        """Replace uniform groups of ``first`` by extra rounds (``gagpo_rllib.rllib.groups``)."""
        cfg = self.config
        bound = cfg.max_extra_groups
        seed = int(cfg.seed or 0)

        def plan_round(round_index: int, groups: int, offset: int) -> list[PlannedEpisode]:
            return extra_plan(
                self.num_tasks(),
                groups=groups,
                group_size=cfg.group_size,
                seed=seed,
                iteration=iteration,
                round_index=round_index,
                first_group_id=EXTRA_GROUP_ID_BASE + iteration * bound + offset,
            )

        return fill_informative_groups(
            first,
            target_groups=cfg.groups_per_iteration,
            max_extra_groups=bound,
            group_size=cfg.group_size,
            plan_round=plan_round,
            play=lambda plan: self.sample_whole_groups(plan, iteration),
            invalid_penalty=cfg.invalid_penalty,
        )

    def sample_whole_groups(
        self, plan: list[PlannedEpisode], iteration: int, *, explore: bool = True
    ) -> GroupSample:
        """Play the plan on the healthy EnvRunners; only complete groups come back (``group_sampling``)."""
        return sample_whole_groups(self, plan, iteration, explore=explore)

    def sample_groups(self, plan: list[PlannedEpisode], iteration: int, *, explore: bool = True):
        """``sample_whole_groups`` as (episodes, timing splits, runner metrics)."""
        sample = self.sample_whole_groups(plan, iteration, explore=explore)
        return sample.episodes, sample.stats, sample.runner_metrics

    def save_to_path(self, *args, **kwargs):
        """RLlib's save and, beside it, the policy as the runners receive it: Hugging Face safetensors in the
        rollout dtype (``rollout_weights/``, ``weight_sync.write_rollout_weights``).

        The float32 master state holds each learner's reference log-prob cache: a restored run without it would
        recompute those values in other batches and drift from the uninterrupted run by their rounding. Sharded
        (FSDP) learners first gather the full weights and optimizer state on learner 0 together, since RLlib asks
        learner 0 alone and a gather needs every learner; the caches are gathered the same way."""
        if self.config.shards_learners:
            self.learner_group.foreach_learner(lambda learner: learner.gather_full_state(optimizer=True))
        if self.config.num_learners > 1:  # each learner caches its own groups' reference log-probs
            self.learner_group.foreach_learner(lambda learner: learner.gather_reference_caches())
        path = super().save_to_path(*args, **kwargs)
        write_rollout_weights(self.learner_group, path)
        write_version(path)
        if self.config.shards_learners:
            self.learner_group.foreach_learner(lambda learner: learner.release_full_state())
        return path

    def restore_from_path(self, path, *args, **kwargs) -> None:
        """Restore, then make every EnvRunner sample with the restored weights.

        RLlib skips a weight sync whose sequence number is older than the runner's, which is the case when a live
        algorithm goes back to an earlier checkpoint; the runners' numbers are reset so the sync goes through.
        """
        # Rollouts in flight were played with the weights replaced now: they are planned again from their seeds.
        if self._pipeline is not None:
            self._pipeline.close()
            self._pipeline = None
        super().restore_from_path(path, *args, **kwargs)

        self.env_runner_group.foreach_env_runner(lambda r: r.set_weights_seq_no(0), local_env_runner=True)
        sync_env_runners(self.env_runner_group, self.learner_group)

    def sample_iteration(self, iteration: int) -> tuple[GroupSample, DynamicSample | None, float]:
        """Play iteration ``iteration``'s plan (and dynamic sampling's extra rounds); logs nothing, so that it can
        run beside the update (``gagpo_rllib.rllib.rollout_pipeline``)."""
        t0 = time.perf_counter()
        sample = self.sample_whole_groups(self.iteration_plan(iteration), iteration)
        dynamic = self.sample_dynamic(sample, iteration) if self.config.dynamic_sampling else None
        return sample, dynamic, time.perf_counter() - t0

    def rollout_pipeline(self) -> RolloutPipeline:
        """The queue of rollout jobs of ``max_staleness`` >= 1, started on first use."""
        if self._pipeline is None:
            overlap = self.env_runner_group.num_remote_env_runners() > 0
            self._pipeline = RolloutPipeline(self.sample_iteration, overlap=overlap)
        return self._pipeline

    def stop(self) -> None:
        # getattr: RLlib stops an Algorithm whose setup failed too.
        if getattr(self, "_pipeline", None) is not None:
            self._pipeline.close()
            self._pipeline = None
        if getattr(self, "background_validation", None) is not None:
            self.background_validation.close()
            self.background_validation = None
        learner_group = getattr(self, "learner_group", None)
        for group in (getattr(self, "env_runner_group", None), getattr(self, "eval_env_runner_group", None)):
            if group is not None and learner_group is not None:
                close_weight_channels(group, learner_group)
        super().stop()

    def take_rollout(self, iteration: int) -> tuple[GroupSample, DynamicSample | None, float, int]:
        """This iteration's episodes and their staleness (updates between the weights that played them and the
        learners' now): played now with ``max_staleness`` 0; else taken from the rollout pipeline, which was
        handed the last update's weights and queued up to ``max_staleness`` iterations ahead first."""
        cfg: GAGPOConfig = self.config
        if cfg.max_staleness == 0:
            return (*self.sample_iteration(iteration), 0)
        updates = self._updates
        pipeline = self.rollout_pipeline()
        if updates > self._published_updates:
            # The learners are idle now: publish the last update's weights for the next queued job.
            pipeline.publish(prepare_sync(self.env_runner_group, self.learner_group), updates)
            self._published_updates = updates
        start = time.perf_counter()
        pipeline.queue_until(iteration + cfg.max_staleness, start=iteration)
        sampled = pipeline.take(iteration)
        self.metrics.log_value(("gagpo", "time_waiting_for_rollout_s"), time.perf_counter() - start, window=1)
        if sampled.sync is not None:
            self.log_weight_sync(sampled.sync)
        return sampled.sample, sampled.dynamic, sampled.sample_s, updates - sampled.weights_version

    def training_step(self) -> None:
        """Sample, decide, update, sync: one iteration."""
        cfg: GAGPOConfig = self.config
        iteration = self.iteration
        if self.background_validation is not None:  # a validation that ended beside training reports now
            self.background_validation.report(self)
        # Per iteration, 0 unless ``restore_env_runners`` brought a training runner back in it.
        self.metrics.log_value(("gagpo", "env_runners_restored"), 0.0, reduce="sum")
        # Sample: the iteration's planned groups, played now or taken from the rollout pipeline (max_staleness).
        with self.metrics.log_time((TIMERS, ENV_RUNNER_SAMPLING_TIMER)):
            sample, dynamic, sample_s, staleness = self.take_rollout(iteration)
        # Decide: the batch (dynamic sampling: its informative groups only) and which of its groups train, stamped
        # on the episodes (the learners' sharding and the learner connector read the stamp).
        batch = dynamic.batch if dynamic is not None else sample.episodes
        played = dynamic.sample if dynamic is not None else sample
        decision = stamp_training_groups(
            batch, invalid_penalty=cfg.invalid_penalty, skip_uniform_groups=cfg.skip_uniform_groups
        )
        self.log_sample_metrics(played, dynamic, decision, sample_s, staleness)
        trainable = bool(batch) and decision.any_trained
        if not batch:
            why = "no complete group came back"
            if dynamic is not None and played.episodes:
                why = "no informative group within dynamic_sampling_max_extra_groups"
            logger.warning("GAGPO: iteration %d: %s; update skipped", iteration, why)
        t0 = time.perf_counter()
        if trainable:
            # Update: whole groups per learner, one shared number of optimizer steps (``groups``).
            self.update_learners(batch)
            self._updates += 1  # the weights' version (``take_rollout``)
            # Sync (with max_staleness >= 1 the next take_rollout publishes the weights instead).
            if cfg.max_staleness == 0:
                with self.metrics.log_time((TIMERS, SYNCH_WORKER_WEIGHTS_TIMER)):
                    synced = sync_env_runners(self.env_runner_group, self.learner_group)
                self.log_weight_sync(synced)
        self.metrics.log_value(("gagpo", "update_skipped"), float(not trainable), window=1)
        if cfg.backend == "vllm":
            self.log_engine_census()
        self.metrics.log_value(("gagpo", "time_learner_s"), time.perf_counter() - t0, window=1)

    def update_learners(self, batch: list) -> None:
        """One update of the learners on ``batch`` (stamped whole groups); with ``sleep_engines_during_update`` the
        vLLM engines free the GPU meanwhile (``engine_sleep``)."""
        cfg: GAGPOConfig = self.config
        with contextlib.ExitStack() as stack:
            if cfg.sleep_engines_during_update:
                stack.enter_context(rollout_engines_asleep(self))
            with self.metrics.log_time((TIMERS, LEARNER_UPDATE_TIMER)):
                learner_results = self.learner_group.update(
                    training_data=GroupShardedTrainingData(episodes=batch),
                    timesteps={
                        NUM_ENV_STEPS_SAMPLED_LIFETIME: self.metrics.peek(
                            (ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME), default=0
                        )
                    },
                    num_epochs=cfg.num_epochs,
                    minibatch_size=cfg.minibatch_size,
                    shuffle_batch_per_epoch=cfg.shuffles_minibatches,
                )
        self.metrics.aggregate(learner_results, key=LEARNER_RESULTS)
        skipped = int(self.metrics.peek((LEARNER_RESULTS, DEFAULT_MODULE_ID, NONFINITE_SKIPPED), default=0))
        if skipped:
            logger.warning(
                "GAGPO iteration %d: %d optimizer step(s) skipped, loss or gradient norm not finite",
                self.iteration,
                skipped,
            )

    def log_sample_metrics(
        self,
        played: GroupSample,
        dynamic: DynamicSample | None,
        decision: TrainingGroups,
        sample_s: float,
        staleness: int,
    ) -> None:
        """The iteration's ``gagpo/`` sampling metrics: over everything played (rollouts), the group decision,
        dynamic sampling's rounds and the runners' own results."""
        self.metrics.log_value(("gagpo", "staleness"), float(staleness), window=1)
        if dynamic is not None:
            for name, value in dynamic.metrics().items():
                self.metrics.log_value(("gagpo", name), value, window=1)
        elif decision.groups:  # the same share dynamic sampling reports: groups without signal
            self.metrics.log_value(("gagpo", "uniform_group_share"), decision.uniform_share, window=1)
        self.metrics.aggregate(played.runner_metrics, key=ENV_RUNNER_RESULTS)
        self.log_rollout_metrics(played.episodes, played.stats, sample_s)
        for name, value in played.metrics().items():
            self.metrics.log_value(("gagpo", name), value, window=1)

    def log_weight_sync(self, synced: SyncReport) -> None:
        """One copy of the inference-only weights per sync, fetched by every runner, broadcast or shared with them
        (``weight_sync``); ``weight_sync_fallbacks`` counts channel syncs that failed over to the object store."""
        self.metrics.log_value(("gagpo", "weight_sync_bytes"), float(synced.nbytes), window=1)
        self.metrics.log_value(("gagpo", "weight_sync_tensors"), float(synced.num_tensors), window=1)
        self.metrics.log_value(("gagpo", "weight_sync_runners"), float(synced.runners), window=1)
        self.metrics.log_value(("gagpo", "weight_sync_s"), synced.seconds, window=1)
        for transport in ("broadcast", "ipc"):
            used = float(synced.transport == transport)
            self.metrics.log_value(("gagpo", f"weight_sync_{transport}"), used, window=1)
        self.metrics.log_value(
            ("gagpo", "weight_sync_fallbacks"), float(synced.fallback), reduce="lifetime_sum"
        )

    def engine_census(self) -> dict[str, Any]:
        """vLLM engines started so far: by the training runners, the evaluation runners and the Algorithm's own
        process (where the local runners live; 0 by design), with each remote runner's report."""
        census: dict[str, Any] = {
            "algorithm_process": _process_engines() - getattr(self, "_engines_before", 0),
            "reports": {},
        }
        groups = {
            "training": self.env_runner_group,
            "evaluation": getattr(self, "eval_env_runner_group", None),
        }
        for name, group in groups.items():
            reports = []
            if group is not None and group.num_remote_env_runners() > 0:
                reports = group.foreach_env_runner(lambda r: r.engine_report(), local_env_runner=False)
            census[name] = sum(r["engines"] for r in reports)
            census["reports"][name] = reports
        return census

    def log_engine_census(self) -> None:
        """``gagpo/engines_*`` every iteration; a log line saying where they run when the numbers change."""
        census = self.engine_census()
        counts = {k: census[k] for k in ("training", "evaluation", "algorithm_process")}
        for name, value in counts.items():
            self.metrics.log_value(("gagpo", f"engines_{name}"), float(value), window=1)
        self.metrics.log_value(("gagpo", "engines_started"), float(sum(counts.values())), window=1)
        if counts != getattr(self, "_engine_counts", None):
            self._engine_counts = counts
            where = "; ".join(
                f"{group} runner {r[Columns.WORKER_INDEX]}: {r['engines']} (pid {r['pid']}, node {str(r['node_id'])[:8]},"
                f" GPUs {r['gpu_ids']})"
                for group, reports in census["reports"].items()
                for r in reports
            )
            logger.info(
                "GAGPO: vLLM engines started: %d by training runners, %d by evaluation runners, %d in the "
                "Algorithm's process; %s",
                counts["training"],
                counts["evaluation"],
                counts["algorithm_process"],
                where,
            )

    def log_rollout_metrics(self, episodes: list, stats: list[RolloutStats], sample_s: float) -> None:
        """Success, return (env rewards), length, invalid share, per-type success and the time split; the mean
        final ``task_score`` when the env reports one (WebShop's purchase score moves before success does)."""
        wins, returns, lengths, invalid, tokens, scores = [], [], [], [], 0, []
        by_type: dict[str, list[float]] = defaultdict(list)
        for ep in episodes:
            end = outcome(ep.get_infos(-1))
            wins.append(float(end.won))
            by_type[end.task_type].append(float(end.won))
            if end.task_score is not None:
                scores.append(end.task_score)
            returns.append(float(ep.get_return()))
            lengths.append(len(ep))
            invalid.extend(bool(x) for x in ep.get_extra_model_outputs(Columns.INVALID))
            tokens += sum(len(ids) for ids in ep.get_extra_model_outputs(Columns.ACTION_IDS))
        gen_s = sum(s.generation_s for s in stats)
        values = {
            "success_rate": float(np.mean(wins)) if wins else 0.0,
            "episode_return_mean": float(np.mean(returns)) if returns else 0.0,
            "episode_len_mean": float(np.mean(lengths)) if lengths else 0.0,
            "invalid_action_share": float(np.mean(invalid)) if invalid else 0.0,
            "num_episodes": float(len(episodes)),
            "time_generation_s": gen_s,
            "time_env_s": sum(s.env_s for s in stats),
            "time_connectors_s": sum(s.connector_s for s in stats),
            "time_sampling_s": sample_s,
            "generated_tokens": float(tokens),
            "generated_tokens_per_s": tokens / gen_s if gen_s > 0 else 0.0,
        }
        if scores:
            values["task_score_mean"] = float(np.mean(scores))
        signal = reward_signal_shares(episodes)
        values.update(signal)
        if episodes and signal["groups_no_reward_signal_share"] >= 1.0:
            logger.warning(
                "GAGPO: iteration %d: no group got any env reward (%.0f%% of groups all-invalid, %.0f%% with "
                "penalty-only advantages): this update learns only from invalid-action penalties or from nothing; "
                "warm-start the answer format first (rllib sft) or set skip_uniform_groups=True",
                self.iteration,
                100 * signal["groups_all_invalid_share"],
                100 * signal["groups_penalty_only_share"],
            )
        for name, wins_of_type in by_type.items():
            values[f"success_rate/{name}"] = float(np.mean(wins_of_type))
        for name, value in values.items():
            self.metrics.log_value(("gagpo", name), value, window=1)
