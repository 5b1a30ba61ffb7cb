"""Every override of RLlib's learner internals, in one place. Written against Ray RLlib 2.60.0.

``ChunkedTorchLearner`` is a ``TorchLearner`` whose optimizer step runs chunk by chunk. It replaces these private
methods of ``ray.rllib.core.learner.learner.Learner`` / ``...torch.torch_learner.TorchLearner`` (2.60.0):

- ``_create_iterator_if_necessary``: minibatches that cover the batch once per epoch, the same number on every
  learner (``sharding``); each row carries its loss weight in the ``Columns.ROW_WEIGHT`` column (0 for a stand-in row
  that only keeps a learner without rows in the collective calls).
- ``_uncompiled_update``: one optimizer step = for each length-sorted chunk of the minibatch, forward, loss and
  backward before the next chunk's forward (activation memory of one chunk, whatever the minibatch), gradients
  accumulated, synchronised over the learners on the last chunk only; then RLlib's postprocess and apply.
- ``_log_steps_trained_metrics``: a stand-in step trains no rows.
- ``_get_optimizer_state`` / ``_set_optimizer_state``: optimizer tensors numpy cannot hold (bfloat16) stay torch
  tensors (RLlib's ``convert_to_numpy`` raises on them); sharded learners save the full, gathered state.
- ``_make_module`` / ``_make_modules_ddp_if_necessary``: FSDP2 sharding (``learner_sharding="fsdp"``) before the
  optimizers exist, instead of RLlib's DDP wrapper.
- ``get_state``: with FSDP, full weights gathered collectively (``gather_full_state``, at build for RLlib's
  first sync and before a checkpoint, released after) and served from that copy, since RLlib asks learner 0
  alone.

The loss of one chunk is ``compute_loss_for_module`` (RLlib's hook, here called once per chunk); its statistics
go to ``self.step_stats`` and are reduced over the learners once per step by ``log_step_stats``. The module
answers the chunked step through ``ChunkedModule``, a small typed protocol.

``RunnerInternals`` is a ``SingleAgentEnvRunner`` whose connectors, device, metrics counters and weights' sequence
number its subclass reaches through public methods; ``local_learner``, ``on_first_learner``,
``on_every_learner``, ``learner_weights_seq_no`` and ``route_learner_group_syncs`` do the same for a
``LearnerGroup`` and an ``EnvRunnerGroup``. Nothing else in the
package touches a private attribute of RLlib (``tests/gagpo_rllib/rllib/test_rllib_boundary.py`` fails if it does),
and importing this module checks that the installed RLlib is the version these overrides were written against.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import ray
import torch
from ray.rllib.core import COMPONENT_OPTIMIZER
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.numpy import convert_to_numpy

from gagpo_rllib.columns import Columns
from gagpo_rllib.method.seeds import shuffle_rng
from gagpo_rllib.policy.distributed import StepStats, agree_sum, world
from gagpo_rllib.rllib.groups import epoch_minibatches, minibatches_per_epoch

logger = logging.getLogger(__name__)

# The learner state's entry for the reference log-prob caches, one dict (module id -> cache state) per learner.
REFERENCE_CACHES = "gagpo_reference_caches"

__all__ = [
    "RLLIB_VERSION",
    "ChunkedModule",
    "ChunkedTorchLearner",
    "RunnerInternals",
    "REFERENCE_CACHES",
    "check_rllib_version",
    "learner_weights_seq_no",
    "local_learner",
    "on_every_learner",
    "on_first_learner",
    "route_learner_group_syncs",
]

# The RLlib release whose private methods this module overrides (pyproject pins it).
RLLIB_VERSION = "2.60.0"


def check_rllib_version(installed: str) -> None:
    """Raise unless ``installed`` is the release of ``RLLIB_VERSION`` (any patch level of it): the overrides below
    replace private RLlib methods, which change between releases without notice."""
    want, got = RLLIB_VERSION.split(".")[:2], installed.split(".")[:2]
    if got != want:
        raise ImportError(
            f"gagpo_rllib overrides RLlib internals written against ray[rllib]=={RLLIB_VERSION}; ray {installed} is"
            f" installed. Install ray[rllib]=={RLLIB_VERSION} (pyproject.toml pins it)."
        )


check_rllib_version(ray.__version__)


def _take(column: Any, idx: np.ndarray) -> Any:
    if isinstance(column, torch.Tensor):
        return column[torch.as_tensor(idx, dtype=torch.long, device=column.device)]
    if isinstance(column, np.ndarray):
        return column[idx]
    return [column[i] for i in idx]


def _placeholder_row(module_batch: SampleBatch, pad_token_id: int) -> dict[str, Any]:
    """One valid one-token step in the batch's layout, for a learner that has no rows at all."""
    row: dict[str, Any] = {}
    for key, column in module_batch.items():
        if isinstance(column, torch.Tensor):
            row[key] = torch.zeros((1, *(max(1, s) for s in column.shape[1:])), dtype=column.dtype)
        elif isinstance(column, np.ndarray):
            row[key] = np.zeros((1, *(max(1, s) for s in column.shape[1:])), dtype=column.dtype)
    for key in (Columns.PROMPT_IDS, Columns.ACTION_IDS, Columns.ALLOWED_IDS):
        if key in row:
            row[key] = torch.full_like(torch.as_tensor(row[key]), pad_token_id)
    for key in (Columns.PROMPT_LEN, Columns.ACTION_LEN):
        if key in row:
            row[key] = torch.ones_like(torch.as_tensor(row[key]))
    return row


def _numpy_or_tensor(value: Any) -> Any:
    """``convert_to_numpy``, except tensors of dtypes numpy has not (bfloat16), which stay CPU tensors."""
    if isinstance(value, dict):
        return {k: _numpy_or_tensor(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_numpy_or_tensor(v) for v in value)
    if isinstance(value, torch.Tensor) and value.dtype == torch.bfloat16:
        return value.detach().cpu().clone()
    return convert_to_numpy(value)


def _tensors(value: Any, device: torch.device) -> Any:
    """Optimizer buffers back to tensors on ``device`` (numpy arrays and the tensors kept above)."""
    if isinstance(value, dict):
        return {k: _tensors(v, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_tensors(v, device) for v in value)
    if isinstance(value, (np.ndarray, np.generic)):
        return torch.as_tensor(np.array(value)).to(device)
    if isinstance(value, torch.Tensor):
        return value.to(device)
    return value


@runtime_checkable
class ChunkedModule(Protocol):
    """What ``ChunkedTorchLearner`` asks of the RLModule it trains (``LLMRLModule`` and its critic subclass)."""

    pad_token_id: int

    def train_chunks(self, batch: Any) -> list[np.ndarray]:
        """Row positions of the minibatch per forward and backward, each within the module's token budget."""

    def forward_rounds(self, count: int) -> int:
        """Forwards to run for ``count`` of this learner's (under FSDP the most over the learners)."""

    def set_gradient_sync(self, enabled: bool) -> None:
        """FSDP: reduce gradients in this backward or accumulate them."""

    def shard_fsdp(self) -> None:
        """Shard the trained models over the learners (FSDP)."""

    def gather_full_state(self) -> None:
        """FSDP: gather the full weights to learner 0 (a collective)."""

    def release_full_state(self) -> None:
        """FSDP: drop learner 0's gathered copy."""


class ChunkedTorchLearner(TorchLearner):
    """A ``TorchLearner`` with covering minibatches, chunked backward, low-precision checkpoints and FSDP."""

    step_stats: StepStats

    # ------------------------------------------------------------------------------------------ public views
    @property
    def device(self) -> torch.device:
        """The device this learner trains on."""
        return self._device

    @property
    def update_count(self) -> int:
        """Updates applied so far (RLlib's weights sequence number; checkpointed)."""
        return int(self._weights_seq_no)

    def trained_module_ids(self) -> list[str]:
        """The modules that have optimizers."""
        return list(self._module_optimizers)

    def drop_gradients(self) -> None:
        """Forget the accumulated gradients of every trained parameter (a skipped step)."""
        for param in self._params.values():
            param.grad = None

    # ------------------------------------------------------------------------------------------ module hooks
    def _inner(self, module_id: str) -> ChunkedModule:
        """The RLModule itself (under DDP the wrapped one)."""
        inner = self.module[module_id].unwrapped()
        if not isinstance(inner, ChunkedModule):
            missing = [
                name
                for name in ("pad_token_id", *(m for m in dir(ChunkedModule) if not m.startswith("_")))
                if not hasattr(inner, name)
            ]
            raise TypeError(f"{type(inner).__name__} cannot train chunk by chunk: it lacks {missing}")
        return inner

    @property
    def sharded(self) -> bool:
        """Whether the learners shard the module with FSDP (``GAGPOConfig.learner_sharding == "fsdp"``)."""
        return getattr(self.config, "learner_sharding", "ddp") == "fsdp" and world()[0] > 1

    def get_parameters(self, module: Any) -> list[torch.nn.Parameter]:
        """The parameters that train (``requires_grad``): all of them, or under LoRA the adapters only, so the
        optimizer, gradient clipping and its checkpointed state see no frozen base weight."""
        return [p for p in module.parameters() if p.requires_grad]

    def _make_module(self):
        module = super()._make_module()
        if self.sharded:
            for sub in module.values():  # not yet wrapped: the RLModules themselves
                sub.shard_fsdp()
        return module

    def _make_modules_ddp_if_necessary(self) -> None:
        if self.sharded:
            return  # FSDP reduces the gradients itself
        super()._make_modules_ddp_if_necessary()

    def build(self) -> None:
        super().build()
        if self.sharded:  # RLlib's set-up reads learner 0's state once for the runners' first weights
            self.gather_full_state()

    # ------------------------------------------------------------------------------------------- minibatches
    def _create_iterator_if_necessary(
        self,
        *,
        training_data,
        num_total_minibatches: int = 0,
        num_epochs: int = 1,
        minibatch_size: int | None = None,
        shuffle_batch_per_epoch: bool = False,
        **kwargs,
    ):
        if training_data.data_iterators:
            return super()._create_iterator_if_necessary(
                training_data=training_data,
                num_total_minibatches=num_total_minibatches,
                num_epochs=num_epochs,
                minibatch_size=minibatch_size,
                shuffle_batch_per_epoch=shuffle_batch_per_epoch,
                **kwargs,
            )
        batch = self._make_batch_if_necessary(training_data=training_data)
        if len(batch.policy_batches) != 1:
            raise ValueError(f"GAGPO trains one module; the batch has {sorted(batch.policy_batches)}")
        return self._covering_minibatches(
            batch,
            num_total_minibatches=int(num_total_minibatches or 0),
            num_epochs=max(1, int(num_epochs or 1)),
            minibatch_size=minibatch_size,
            shuffle=bool(shuffle_batch_per_epoch),
        )

    def _covering_minibatches(
        self,
        batch: MultiAgentBatch,
        *,
        num_total_minibatches: int,
        num_epochs: int,
        minibatch_size,
        shuffle: bool,
    ) -> Iterator[MultiAgentBatch]:
        """``num_total_minibatches`` steps (or ``num_epochs`` x ``ceil(n / minibatch_size)``), each epoch a cover."""
        ((module_id, module_batch),) = batch.policy_batches.items()
        n = len(module_batch)
        if num_total_minibatches > 0:
            total = num_total_minibatches
            per_epoch = -(-total // num_epochs)
        else:
            per_epoch = minibatches_per_epoch(n, minibatch_size)
            total = per_epoch * num_epochs
        _, rank = world()
        placeholder = None
        done, epoch = 0, 0
        while done < total:
            rng = None
            if shuffle and per_epoch > 1:
                # The update's sequence number is checkpointed: a restored run shuffles as the uninterrupted one.
                rng = shuffle_rng(int(self.config.seed or 0), self.update_count, epoch, rank)
            for idx in epoch_minibatches(n, per_epoch, rng):
                if done == total:
                    break
                if len(idx):
                    rows = SampleBatch({k: _take(v, idx) for k, v in module_batch.items()})
                elif n:  # a stand-in: one of this learner's rows, trained with weight 0
                    rows = SampleBatch(
                        {k: _take(v, np.zeros(1, dtype=np.int64)) for k, v in module_batch.items()}
                    )
                else:
                    if placeholder is None:
                        pad = self._inner(module_id).pad_token_id
                        placeholder = _placeholder_row(module_batch, pad)
                    rows = SampleBatch(dict(placeholder))
                rows[Columns.ROW_WEIGHT] = torch.full((len(rows),), float(len(idx) > 0))
                done += 1
                yield MultiAgentBatch({module_id: rows}, env_steps=len(idx))
            epoch += 1

    def _log_steps_trained_metrics(self, batch: MultiAgentBatch) -> None:
        # A stand-in step trains no rows.
        if any(
            bool((b[Columns.ROW_WEIGHT] > 0).any())
            for b in batch.policy_batches.values()
            if Columns.ROW_WEIGHT in b
        ):
            super()._log_steps_trained_metrics(batch)

    # ------------------------------------------------------------------------------------------ one step
    def _uncompiled_update(self, batch: dict[str, Any], **kwargs):
        """Forward, loss and backward chunk by chunk, then RLlib's gradient postprocessing and optimizer step."""
        self._compute_off_policyness(batch)
        ((module_id, module_batch),) = batch.items()
        module = self.module[module_id]
        inner = self._inner(module_id)
        config = self.config.get_config_for_module(module_id)

        weights = torch.as_tensor(module_batch[Columns.ROW_WEIGHT], dtype=torch.float32)
        global_rows = agree_sum(float((weights > 0).sum()), self._device)
        scale = world()[0] / global_rows if global_rows > 0 else 0.0
        module_batch[Columns.ROW_WEIGHT] = weights * scale

        chunks = inner.train_chunks(module_batch)
        chunks += [None] * (inner.forward_rounds(len(chunks)) - len(chunks))  # FSDP: as many on every learner

        for optim in self._optimizer_parameters:
            optim.zero_grad(set_to_none=True)
        self.step_stats = StepStats()
        total = torch.zeros(())
        for i, idx in enumerate(chunks):
            if idx is None:  # a stand-in chunk: row 0 with weight 0
                sub = {k: _take(v, np.zeros(1, dtype=np.int64)) for k, v in module_batch.items()}
                sub[Columns.ROW_WEIGHT] = torch.zeros(1)
            else:
                sub = {k: _take(v, idx) for k, v in module_batch.items()}
            with self._gradient_sync(module, i == len(chunks) - 1):
                fwd_out = module.forward_train(sub)
                loss = self.compute_loss_for_module(
                    module_id=module_id, config=config, batch=sub, fwd_out=fwd_out
                )
                if loss.requires_grad:
                    loss.backward()
            total = total + loss.detach().cpu()
            del fwd_out, loss
        self.log_step_stats(module_id, self.step_stats)

        gradients = {pid: p.grad for pid, p in self._params.items()}
        self.apply_gradients(self.postprocess_gradients(gradients))
        return {}, {module_id: total}, {}

    def _gradient_sync(self, module: Any, last: bool) -> contextlib.AbstractContextManager:
        """Gradients reduced over the learners on the step's last chunk only (accumulated locally before)."""
        if last or world()[0] == 1:
            if self.sharded:
                module.unwrapped().set_gradient_sync(True)
            return contextlib.nullcontext()
        if self.sharded:
            module.unwrapped().set_gradient_sync(False)
            return contextlib.nullcontext()
        return module.no_sync() if hasattr(module, "no_sync") else contextlib.nullcontext()

    def log_step_stats(self, module_id: str, stats: StepStats) -> None:
        """Reduce this step's statistics over the learners and log them (subclasses say which)."""

    # ---------------------------------------------------------------------------------------------- state
    def gather_full_state(self, *, optimizer: bool = False) -> None:
        """FSDP: gather the full weights (and, if asked, optimizer state) to learner 0, for RLlib's
        ``get_state``, which asks learner 0 alone (a checkpoint; the weight sync gathers bucket by bucket
        instead). A collective: every learner calls it; ``release_full_state`` frees the copy."""
        for sub in self.module.values():
            sub.unwrapped().gather_full_state()
        self._full_optimizer_state = None
        if optimizer:
            from gagpo_rllib.policy.fsdp import full_optimizer_state

            self._full_optimizer_state = {
                name: {
                    "module_id": self._optimizer_name_to_module[name],
                    "state": full_optimizer_state(self._inner(self._optimizer_name_to_module[name]), optim),
                    "fsdp_full": True,
                }
                for name, optim in self._named_optimizers.items()
            }

    def release_full_state(self) -> None:
        """FSDP: free learner 0's gathered host copies of the weights and optimizer state."""
        for sub in self.module.values():
            sub.unwrapped().release_full_state()
        self._full_optimizer_state = None

    def get_state(self, components=None, *, not_components=None, **kwargs):
        if (
            self.sharded
            and self._check_component(COMPONENT_OPTIMIZER, components, not_components)
            and getattr(self, "_full_optimizer_state", None) is None
        ):
            raise RuntimeError(
                "FSDP learner: the optimizer state is sharded; call gather_full_state(optimizer=True) on every "
                "learner first (GAGPO.save_to_path does)"
            )
        state = super().get_state(components, not_components=not_components, **kwargs)
        if self._check_component(REFERENCE_CACHES, components, not_components):
            gathered, self._gathered_caches = getattr(self, "_gathered_caches", None), None
            if gathered is None and world()[0] == 1:
                gathered = [self._reference_cache_states()]
            state[REFERENCE_CACHES] = gathered
        return state

    def set_state(self, state: dict) -> None:
        """RLlib's restore, and each learner's reference caches back as they were saved (its own rank's)."""
        super().set_state(state)
        caches = state.get(REFERENCE_CACHES)
        if caches is None:
            return
        size, rank = world()
        if len(caches) != size:
            logger.warning(
                "reference caches saved by %d learners, restored into %d: they start empty (reference log-probs "
                "are recomputed, equal up to float rounding)",
                len(caches),
                size,
            )
            return
        for module_id, cache_state in caches[rank].items():
            self.module[module_id].unwrapped().reference_cache.set_state(cache_state)

    def gather_reference_caches(self) -> None:
        """Every learner's reference caches to every learner (a collective: each caches the rows of its own
        groups), for learner 0's next ``get_state``; GAGPO.save_to_path calls it on all learners. A lone
        learner's ``get_state`` takes its own."""
        size, _ = world()
        if size == 1:
            return
        gathered: list[Any] = [None] * size
        torch.distributed.all_gather_object(gathered, self._reference_cache_states())
        self._gathered_caches = gathered

    def _reference_cache_states(self) -> dict[str, dict]:
        out = {}
        for module_id, sub in self.module.items():
            cache = getattr(sub.unwrapped(), "reference_cache", None)
            if cache is not None:
                out[module_id] = cache.get_state()
        return out

    def _get_optimizer_state(self) -> dict:
        if self.sharded:
            state, self._full_optimizer_state = self._full_optimizer_state, None
            return state
        return {
            name: {
                "module_id": self._optimizer_name_to_module[name],
                "state": _numpy_or_tensor(optim.state_dict()),
            }
            for name, optim in self._named_optimizers.items()
        }

    def _set_optimizer_state(self, state: dict) -> None:
        for name, entry in state.items():
            if name not in self._named_optimizers:
                continue
            optim = self._named_optimizers[name]
            if entry.get("fsdp_full"):
                from gagpo_rllib.policy.fsdp import load_full_optimizer_state

                load_full_optimizer_state(self._inner(entry["module_id"]), optim, entry["state"])
                continue
            saved = entry["state"]
            optim.load_state_dict({**saved, "state": _tensors(saved["state"], self._device)})


# ---------------------------------------------------------------------------------------------------- EnvRunners
class RunnerInternals(SingleAgentEnvRunner):
    """A ``SingleAgentEnvRunner`` whose internals a subclass with its own sampling loop reaches through methods."""

    @property
    def device(self) -> torch.device:
        """The device the runner's module lives on."""
        return self._device

    def env_to_module(self, episodes: list, *, explore: bool) -> dict:
        """RLlib's env-to-module connector pipeline on ``episodes`` (the module's forward input)."""
        return self._env_to_module(
            rl_module=self.module,
            batch={},
            episodes=episodes,
            explore=explore,
            shared_data={},
            metrics=self.metrics,
        )

    def module_to_env(self, out: dict, episodes: list, *, explore: bool) -> dict:
        """RLlib's module-to-env connector pipeline on the module's output ``out`` (actions for the envs)."""
        return self._module_to_env(
            rl_module=self.module,
            batch=out,
            episodes=episodes,
            explore=explore,
            shared_data={},
            metrics=self.metrics,
        )

    def count_sampled(self, done: Sequence, env_steps: int) -> None:
        """Account finished episodes and env steps as RLlib's ``sample`` does (its episode and step metrics)."""
        self._done_episodes_for_metrics.extend(done)
        self._increase_sampled_metrics(env_steps, len(done))

    def weights_seq_no(self) -> int:
        """The sequence number of the weights this runner holds (0 for a fresh, never-synced runner)."""
        return int(self._weights_seq_no)

    def set_weights_seq_no(self, seq_no: int) -> None:
        """Record ``seq_no`` as held without loading weights (0: the next sync loads whatever its number)."""
        self._weights_seq_no = int(seq_no)


# ------------------------------------------------------------------------------------------------- groups
def local_learner(learner_group: Any) -> ChunkedTorchLearner:
    """The learner of a local ``LearnerGroup`` (``num_learners=0``)."""
    if not learner_group.is_local:
        raise ValueError("the learner group has remote learners; use on_first_learner")
    return learner_group._learner


def learner_weights_seq_no(learner: Any) -> int:
    """The sequence number of ``learner``'s weights (what ``Learner.get_state`` reports, without building it)."""
    return int(learner._weights_seq_no)


def on_every_learner(learner_group: Any, fn: Callable[[Any], Any]) -> list[Any]:
    """``fn(learner)`` on every healthy remote learner at once (collectives need them all); their results."""
    return learner_group._get_results(learner_group.foreach_learner(fn))


def on_first_learner(learner_group: Any, fn: Callable[[Any], Any]) -> Any:
    """``fn(learner)`` on the first healthy remote learner; its result (errors raised here)."""
    first = learner_group._worker_manager.healthy_actor_ids()[0]
    results = learner_group.foreach_learner(fn, remote_actor_ids=[first])
    return learner_group._get_results(results)[0]


def route_learner_group_syncs(
    group: Any, learner_group: Any, sync: Callable[[Any, Any, list[int] | None], Any]
) -> None:
    """Send RLlib's own inference-only syncs of ``group`` from ``learner_group`` (after a restore, before each
    validation, to restored runners) through ``sync(group, learner_group, worker_ids)`` (None: every runner);
    syncs with global variables, or from an EnvRunner, stay RLlib's ``EnvRunnerGroup.sync_weights``."""
    rllib_sync = group.sync_weights

    def sync_weights(policies: Any = None, from_worker_or_learner_group: Any = None, **kwargs: Any) -> None:
        ours = from_worker_or_learner_group is learner_group and kwargs.get("global_vars") is None
        if ours and kwargs.get("inference_only", False):
            workers = kwargs.get("to_worker_indices")
            sync(group, learner_group, None if workers is None else list(workers))
            return
        rllib_sync(policies=policies, from_worker_or_learner_group=from_worker_or_learner_group, **kwargs)

    group.sync_weights = sync_weights
