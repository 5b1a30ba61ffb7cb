"""The names of every batch column and episode key GAGPO passes between its parts (like RLlib's ``Columns``).

One place for the strings, so that a writer and its readers (EnvRunner, connectors, RLModule, Learner, sharding)
cannot drift apart. Imports nothing of ours: ``policy`` and ``rllib`` both use it.

Where each name lives:

- episode ``custom_data`` (set by the EnvRunner from the driver's plan, or by the driver): ``GROUP_ID``,
  ``TASK_ID``, ``MEMBER``, ``ATTEMPT``, ``WORKER_INDEX``, ``WEIGHTS_SEQ_NO``, ``ENV_ERROR``, ``TRAINS``;
- env-to-module batch (``PromptConnector`` -> ``LLMRLModule``): ``PROMPTS``, ``ADMISSIBLE``, ``GEN_SEED``;
- per step in the episode's extra model outputs (module-to-env): ``PROMPT_IDS``, ``ACTION_IDS``,
  ``ACTION_LOGP``, ``ENV_ACTION``, ``INVALID``, ``INVALID_REASON``, ``STATE_KEY``;
- train batch (``GroupedAdvantages`` -> Learner): ``PROMPT_IDS``, ``PROMPT_LEN``, ``ACTION_IDS``, ``ACTION_LEN``,
  ``OLD_LOGP``, ``BEHAVIOUR_WEIGHT``, ``ADVANTAGES``, ``INVALID``, ``ALLOWED_IDS``, ``ROW_WEIGHT`` (added per chunk by the learner),
  ``OLD_VALUES`` and ``VALUE_TARGETS`` (critic baseline);
- train forward output (``LLMRLModule`` / ``CriticRLModule``): ``LOGP``, ``MASK``, ``REF_LOGP``, ``ENTROPY``,
  ``UNIQUE_ROW_SHARE``, ``REFERENCE_CACHE_HIT_SHARE``, ``VALUES``.
"""

from __future__ import annotations

__all__ = ["Columns"]


class Columns:
    """Batch column names and episode keys (class constants; never instantiated)."""

    # Episode custom_data.
    GROUP_ID = "group_id"  # the K rollouts of one task instance share it
    TASK_ID = "task_id"
    MEMBER = "member"  # 0..K-1 within the group
    ATTEMPT = "attempt"  # re-plays of this member within the iteration
    WORKER_INDEX = "worker_index"  # the EnvRunner that played it
    WEIGHTS_SEQ_NO = "weights_seq_no"  # the sequence number of the weights it was played with
    ENV_ERROR = "env_error"  # the env error that ended the episode (also in the last info)
    TRAINS = "gagpo_trains"  # the driver's decision: this episode's group is in this iteration's update

    # Env-to-module batch.
    PROMPTS = "prompts"
    ADMISSIBLE = "admissible"
    GEN_SEED = "gen_seed"

    # Per step in the episode's extra model outputs (and, padded, in the train batch).
    PROMPT_IDS = "prompt_ids"
    ACTION_IDS = "action_ids"
    ACTION_LOGP = "action_logp"  # behaviour log-probs of the rollout backend
    ENV_ACTION = "env_action"  # the action text the env received
    INVALID = "invalid"
    INVALID_REASON = "invalid_reason"
    STATE_KEY = "state_key"  # the configured state key (also the env info key it derives from)

    # Train batch.
    PROMPT_LEN = "prompt_len"
    ACTION_LEN = "action_len"
    OLD_LOGP = "old_logp"
    BEHAVIOUR_WEIGHT = "behaviour_weight"  # per step: min(pi_prox / pi_behav, cap), off-policy steps only
    ADVANTAGES = "advantages"
    ALLOWED_IDS = "allowed_ids"
    # 1 for trained rows, 0 for stand-ins; scaled to N / (rows of the step over all learners) before the loss, so
    # that the learners' summed (DDP: averaged x N) gradients are the step's mean.
    ROW_WEIGHT = "row_weight"
    OLD_VALUES = "old_values"
    VALUE_TARGETS = "value_targets"

    # Train forward output.
    LOGP = "logp"
    MASK = "mask"
    REF_LOGP = "ref_logp"
    ENTROPY = "entropy"
    UNIQUE_ROW_SHARE = "unique_row_share"
    REFERENCE_CACHE_HIT_SHARE = "reference_cache_hit_share"
    VALUES = "values"

    def __init__(self) -> None:
        raise TypeError("Columns is a namespace of constants; use Columns.GROUP_ID etc.")

    @classmethod
    def names(cls) -> dict[str, str]:
        """Constant name -> column name, for every column."""
        return {k: v for k, v in vars(cls).items() if k.isupper() and isinstance(v, str)}
