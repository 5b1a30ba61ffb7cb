"""Rollout benchmarks: tokens/s of the HF backend vs raw ``generate``, its peak memory, and vLLM memory shares.

Default: tokens/s of the rollout backend vs raw Hugging Face generate on the same batch shape, side by side (the
backend adds tokenisation, its own decoding loop and the behaviour log-prob extraction). Runs the tiny offline
policy by default; pass --model for any causal LM folder.

``--memory``: peak memory of one HF-backend call with a 151,936-token vocabulary (Qwen2.5's; a tiny model with its
embeddings resized), before (``generate(output_logits=True)``, every position's logits stacked, B x T x V floats:
the way the backend used to work, reproduced here) and after (the backend's own loop: one [B, V] at a time). Each
path runs in a fresh process and its peak is measured (CUDA: ``max_memory_allocated``; CPU: the peak resident set
above the process's level before the call). On a machine without memory for the stacked path at the full length,
``--before-tokens`` measures it at fewer new tokens; its figure at the full length is then extrapolated linearly
from two measured lengths and printed as such (its size grows as B x T x V).

``--vllm-memory``: the one-GPU memory arithmetic of gagpo_rllib/policy/generation/vllm.py (engine weights, KV cache,
``gpu_memory_utilization``) for Qwen2.5-1.5B and 7B.

``--backends``: ``backend="hf"`` against ``backend="vllm"`` (vLLM's CPU build here) side by side on the maze
default and the ALFWorld default (tuned_examples/; ALFWorld without its warm start and validation): per task and
backend, in a fresh process each, tokens/s of one batched call (the task's policy and batch, ~``--prompt-tokens``
prompt tokens, ``--new-tokens`` free tokens, and constrained), the process's peak memory above its level before
the backend was built, then ``--iterations`` training iterations of the task on one remote EnvRunner with one
torch thread (vLLM engines run on remote runners only; the first iteration, which includes the engine's
start-up, is not counted), same seeds. Prints the HF/vLLM ratio of tokens/s and of seconds per iteration, and the mean success.

    python benchmarks/bench_rollout.py [--model PATH] [--batch 16] [--prompt-tokens 300] [--new-tokens 32]
    python benchmarks/bench_rollout.py --memory [--batch 64] [--new-tokens 256] [--before-tokens 16 32]
    python benchmarks/bench_rollout.py --vllm-memory
    python benchmarks/bench_rollout.py --backends [--tasks maze alfworld] [--iterations 4] [--seed 0]
    python benchmarks/bench_rollout.py --engine-start [--model PATH] [--starts 3]

``--engine-start``: seconds to build a vLLM engine (``VLLMGenerationBackend``, float32), ``--starts`` times in a
fresh process each, with no files folder chosen (so the compile caches go to the user's cache folder, here a new
``$XDG_CACHE_HOME`` per setting): with the CPU build's AOT compile cache (``VLLM_USE_AOT_COMPILE=1``, vLLM's
default) against the backend's default (``0``), side by side, and the seconds of one batched call after each
start. Later starts are the ones a cache can speed up.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from gagpo_rllib.policy.generation import HFGenerationBackend, SamplingConfig
from gagpo_rllib.policy.logprobs import scaled_logprobs
from gagpo_rllib.policy.models import build_tiny_policy, load_policy

QWEN_VOCAB = 151_936


def _prompts(tok, batch: int, prompt_tokens: int) -> list[str]:
    """Chat prompts of varied length (down to 60% of ``prompt_tokens``) so the batch is left-padded."""
    words = [
        "you",
        "are",
        "in",
        "the",
        "hall",
        "exits",
        "north",
        "east",
        "south",
        "west",
        "a",
        "key",
        "lies",
        "on",
        "the",
        "table",
    ]
    prompts = []
    for i in range(batch):
        target = int(prompt_tokens * (0.6 + 0.4 * i / max(batch - 1, 1)))
        body = " ".join(words[j % len(words)] for j in range(target))
        ids = tok(body, add_special_tokens=False)["input_ids"][: max(target - 12, 1)]
        prompts.append(
            tok.apply_chat_template(
                [{"role": "user", "content": tok.decode(ids)}], add_generation_prompt=True, tokenize=False
            )
        )
    return prompts


def _sample(model, tok, prompts: list[str], new_tokens: int, seed: int, **extra):
    """Plain HF ``generate`` sampling at temperature 1: (prompt width, its output)."""
    enc = tok(prompts, add_special_tokens=False, padding=True, return_tensors="pt").to(model.device)
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(
            **enc,
            do_sample=True,
            top_k=0,
            top_p=1.0,
            temperature=1.0,
            max_new_tokens=new_tokens,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
            **extra,
        )
    return enc["input_ids"].shape[1], out


def _raw_generate(model, tok, prompts: list[str], new_tokens: int, seed: int) -> int:
    width, out = _sample(model, tok, prompts, new_tokens, seed)
    count = 0
    for row in out[:, width:].tolist():
        count += row.index(tok.eos_token_id) + 1 if tok.eos_token_id in row else len(row)
    return count


def _backend_generate(
    backend: HFGenerationBackend, prompts: list[str], new_tokens: int, seed: int, **kw
) -> int:
    outs = backend.generate(
        prompts, sampling=SamplingConfig(max_new_tokens=new_tokens, **kw.pop("cfg", {})), seed=seed, **kw
    )
    return sum(len(o.action_ids) for o in outs)


def _run(fn, seed: int) -> tuple[int, float]:
    """(new tokens, seconds) of one call."""
    t0 = time.perf_counter()
    n = fn(seed)
    return n, time.perf_counter() - t0


def throughput(args: argparse.Namespace) -> None:
    """Tokens/s of raw HF generate and of the backend (free and constrained), interleaved repeats."""
    with tempfile.TemporaryDirectory() as tmp:
        path = args.model or build_tiny_policy(
            f"{tmp}/tiny", hidden_size=256, num_layers=4, num_heads=4, intermediate_size=1024
        )
        model, tok = load_policy(path, device=args.device)
        backend = HFGenerationBackend((model, tok), device=args.device)
        prompts = _prompts(tok, args.batch, args.prompt_tokens)
        admissible = [["go north", "go south", "take the key from the table", "look"]] * args.batch
        paths = {
            "raw HF generate": lambda seed: _raw_generate(model, tok, prompts, args.new_tokens, seed),
            "HFGenerationBackend": lambda seed: _backend_generate(backend, prompts, args.new_tokens, seed),
            "HFGenerationBackend, constrained": lambda seed: _backend_generate(
                backend, prompts, args.new_tokens, seed, admissible=admissible, cfg={"constrained": True}
            ),
        }
        for fn in paths.values():
            fn(0)  # warm-up
        totals = {name: [0, 0.0] for name in paths}
        for r in range(args.repeats):  # interleaved, so load changes hit every path alike
            for name, fn in paths.items():
                n, dt = _run(fn, r + 1)
                totals[name][0] += n
                totals[name][1] += dt
    rates = {name: n / dt for name, (n, dt) in totals.items()}
    raw = rates["raw HF generate"]
    model_name = "tiny 4 x 256" if args.model is None else args.model
    print(
        f"batch {args.batch} x ~{args.prompt_tokens} prompt tokens -> up to {args.new_tokens} new tokens, "
        f"{args.device}, {torch.get_num_threads()} threads, model {model_name}, {args.repeats} interleaved repeats"
    )
    for name, rate in rates.items():
        print(f"{name:34s}: {rate:9.1f} new tok/s   ratio to raw = {rate / raw:.3f}")
    print("(constrained answers are a few tokens each, so per-call costs weigh more in its tokens/s)")


# --------------------------------------------------------------------------------------- hf against vllm
ROOT = Path(__file__).resolve().parents[1]
TASKS = ("maze", "alfworld")


def _task_config(task: str, backend: str, seed: int):
    """The task's CPU default with ``backend``, on one remote EnvRunner (vLLM engines run on remote runners
    only) with one torch thread, without evaluation."""
    import runpy

    if task == "maze":
        example = runpy.run_path(str(ROOT / "tuned_examples" / "gagpo_builtin.py"), run_name="bench_rollout")
        config = example["make_config"](seed=seed, num_env_runners=1)
    else:
        os.environ["GAGPO_ALFWORLD_WARM_START"] = "0"
        example = runpy.run_path(str(ROOT / "tuned_examples" / "gagpo_alfworld.py"), run_name="bench_rollout")
        config = example["cpu_config"](seed=seed, num_env_runners=1, warm=False)
        config.evaluation(evaluation_interval=None)
    # the same prompt limit for both (the vLLM engine is sized to it)
    extra = {"max_prompt_tokens": 2048} if config.max_prompt_tokens is None else {}
    return config.env_runners(backend=backend, torch_threads=1).llm(**extra)


def _backend_child(args: argparse.Namespace) -> None:
    """One task x backend in this process: tokens/s and memory of one call, then seconds per iteration."""
    torch.set_num_threads(1)
    task, backend_name = args.backend_child
    config = _task_config(task, backend_name, args.seed)
    model_path = config.model_path
    batch = config.group_size * config.groups_per_iteration
    from gagpo_rllib.policy.generation import make_backend

    base = _rss_bytes()
    if backend_name == "hf":
        backend = make_backend("hf", model_path)
    else:
        backend = make_backend("vllm", model_path, dtype="float32", max_model_len=args.prompt_tokens + 512)
    tok = backend.tokenizer
    prompts = _prompts(tok, batch, args.prompt_tokens)
    admissible = [["go north", "go south", "take the key from the table", "look"]] * batch
    calls = {
        "free": lambda seed: _backend_generate(backend, prompts, args.new_tokens, seed),
        "constrained": lambda seed: _backend_generate(
            backend, prompts, args.new_tokens, seed, admissible=admissible, cfg={"constrained": True}
        ),
    }
    out: dict = {"task": task, "backend": backend_name, "batch": batch}
    for name, fn in calls.items():
        fn(0)  # warm-up (kernel compilation, grammar caches)
        n, dt = 0, 0.0
        for r in range(args.repeats):
            k, t = _run(fn, r + 1)
            n, dt = n + k, dt + t
        out[f"tok_s_{name}"] = n / dt
    out["generation_memory_gib"] = (
        max(_rss_bytes(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024) - base
    ) / 2**30
    if hasattr(backend, "close"):
        backend.close()  # one in-process engine at a time: the run below starts its own
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    algo = config.build_algo()
    try:
        seconds, success, generation, learner = [], [], [], []
        for _ in range(args.iterations):
            start = time.perf_counter()
            result = algo.train()
            seconds.append(time.perf_counter() - start)
            g = result["gagpo"]
            success.append(float(g["success_rate"]))
            generation.append(float(g["time_generation_s"]))
            learner.append(float(g["time_learner_s"]))
    finally:
        algo.stop()
    out.update(seconds=seconds, success=success, generation_s=generation, learner_s=learner)
    print("RESULT " + json.dumps(out), flush=True)


def backends(args: argparse.Namespace) -> None:
    """HF against vLLM, task by task, each in a fresh process; engine files in one folder removed at the end."""
    files = Path(tempfile.mkdtemp(prefix="bench-rollout-vllm-"))
    env = {**os.environ, "GAGPO_VLLM_FILES": str(files), "PYTHONPATH": str(ROOT)}
    try:
        rows = {}
        for task in args.tasks:
            for name in ("hf", "vllm"):
                cmd = [
                    sys.executable, __file__, "--backend-child", task, name, "--seed", str(args.seed),
                    "--iterations", str(args.iterations), "--prompt-tokens", str(args.prompt_tokens),
                    "--new-tokens", str(args.new_tokens), "--repeats", str(args.repeats),
                ]  # fmt: skip
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
                lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
                if proc.returncode or not lines:
                    sys.stderr.write(proc.stderr[-4000:])
                    raise RuntimeError(f"{task}/{name}: the benchmark child failed (exit {proc.returncode})")
                rows[task, name] = json.loads(lines[-1][len("RESULT ") :])
    finally:
        shutil.rmtree(files, ignore_errors=True)
    print(
        f"hf vs vllm (vLLM CPU build), {args.prompt_tokens} prompt tokens -> up to {args.new_tokens} new tokens, "
        f"one torch thread, {args.repeats} repeats per call, {args.iterations} iterations (the first not "
        f"counted), seed {args.seed}"
    )
    print(
        f"{'task':9s} {'backend':7s} {'batch':>5s} {'free tok/s':>10s} {'constr tok/s':>12s} {'gen mem GiB':>11s} "
        f"{'s/iter':>7s} {'generation':>10s} {'learner':>8s} {'success':>8s}"
    )
    for (task, name), r in rows.items():

        def mean(key: str, r: dict = r) -> float:
            return float(np.mean(r[key][1:] or r[key]))

        print(
            f"{task:9s} {name:7s} {r['batch']:5d} {r['tok_s_free']:10.1f} {r['tok_s_constrained']:12.1f} "
            f"{r['generation_memory_gib']:11.2f} {mean('seconds'):7.2f} {mean('generation_s'):10.2f} "
            f"{mean('learner_s'):8.2f} {np.mean(r['success']):8.3f}"
        )
    print("(s/iter, generation and learner: seconds per iteration, means without the first iteration)")
    for task in args.tasks:
        hf, vl = rows[task, "hf"], rows[task, "vllm"]
        it_hf = float(np.mean(hf["seconds"][1:] or hf["seconds"]))
        it_vl = float(np.mean(vl["seconds"][1:] or vl["seconds"]))
        print(
            f"{task}: vLLM/HF tokens/s free {vl['tok_s_free'] / hf['tok_s_free']:.2f}, constrained "
            f"{vl['tok_s_constrained'] / hf['tok_s_constrained']:.2f}; HF/vLLM seconds per iteration "
            f"{it_hf / it_vl:.2f} (>1: vLLM faster); per-iteration seconds hf {_fmt(hf['seconds'])} "
            f"vllm {_fmt(vl['seconds'])}"
        )


def _engine_start_child(args: argparse.Namespace) -> None:
    """One engine start and one call in this process; prints ``RESULT {json}``."""
    from gagpo_rllib.policy.generation.vllm import VLLMGenerationBackend

    started = time.monotonic()
    backend = VLLMGenerationBackend(
        args.model, dtype="float32", max_model_len=args.prompt_tokens + args.new_tokens
    )
    start_s = time.monotonic() - started
    prompts = _prompts(backend.tokenizer, args.batch, args.prompt_tokens)
    _, call_s = _run(lambda seed: _backend_generate(backend, prompts, args.new_tokens, seed), 1)
    backend.close()
    print("RESULT " + json.dumps({"start_s": start_s, "call_s": call_s}), flush=True)


def engine_start(args: argparse.Namespace) -> None:
    """AOT cache on against off, ``--starts`` fresh processes each, each setting with a cache folder of its own."""
    work = Path(tempfile.mkdtemp(prefix="bench-engine-start-"))
    try:
        model = args.model or str(
            build_tiny_policy(
                work / "tiny", hidden_size=256, num_layers=4, num_heads=4, intermediate_size=1024
            )
        )
        rows: dict[str, list[dict]] = {}
        for name, aot in (("AOT cache (vLLM's default)", "1"), ("backend default", "0")):
            env = {
                k: v for k, v in os.environ.items() if k not in ("GAGPO_VLLM_FILES", "VLLM_USE_AOT_COMPILE")
            }
            env.update(
                XDG_CACHE_HOME=str(work / f"cache_aot{aot}"), VLLM_USE_AOT_COMPILE=aot, PYTHONPATH=str(ROOT)
            )
            for _ in range(args.starts):
                cmd = [
                    sys.executable, __file__, "--engine-start-child", "--model", model, "--batch", str(args.batch),
                    "--prompt-tokens", str(args.prompt_tokens), "--new-tokens", str(args.new_tokens),
                ]  # fmt: skip
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
                lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
                if proc.returncode or not lines:
                    sys.stderr.write(proc.stderr[-4000:])
                    raise RuntimeError(f"{name}: the engine-start child failed (exit {proc.returncode})")
                rows.setdefault(name, []).append(json.loads(lines[-1][len("RESULT ") :]))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"vLLM engine start, model {args.model or 'tiny 4 x 256'}, float32, {args.starts} starts in fresh "
        f"processes per setting; one call of {args.batch} prompts x ~{args.prompt_tokens} tokens -> "
        f"{args.new_tokens} new tokens after each"
    )
    for name, runs in rows.items():
        print(
            f"{name:27s}: start s {_fmt([r['start_s'] for r in runs])}   call s {_fmt([r['call_s'] for r in runs])}"
        )
    (aot, default) = rows.values()
    later = slice(1, None) if args.starts > 1 else slice(None)
    ratio = np.mean([r["start_s"] for r in aot[later]]) / np.mean([r["start_s"] for r in default[later]])
    print(f"later starts, AOT cache / backend default: {ratio:.2f} (>1: the backend's default starts faster)")


def _fmt(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.1f}" for v in values) + "]"


# ------------------------------------------------------------------------------------------------- peak memory
def _stacked_logits_generate(model, tok, prompts: list[str], new_tokens: int, seed: int) -> int:
    """The former backend: ``generate(output_logits=True)``, all logits stacked, then the log-probs."""
    width, out = _sample(
        model, tok, prompts, new_tokens, seed, output_logits=True, return_dict_in_generate=True
    )
    new = out.sequences[:, width:]
    with torch.no_grad():
        logits = torch.stack(out.logits, dim=1)  # [B, T, V]
        scaled_logprobs(logits, new, temperature=1.0)
    return int(new.numel())


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _measure(args: argparse.Namespace) -> None:
    """Child process: peak memory of one call of ``args.path`` ("before" or "after"); prints one JSON line."""
    import gc
    import threading

    model, tok = load_policy(args.model, device=args.device)
    backend = HFGenerationBackend((model, tok), device=args.device)
    prompts = _prompts(tok, args.batch, args.prompt_tokens)

    def run(ps: list[str], n: int) -> int:
        if args.path == "before":
            return _stacked_logits_generate(model, tok, ps, n, seed=1)
        outs = backend.generate(ps, sampling=SamplingConfig(max_new_tokens=n), seed=1)
        return sum(len(o.action_ids) for o in outs)

    run(prompts[:2], 2)  # warm-up
    gc.collect()
    cuda = torch.device(args.device).type == "cuda"
    peak = [0]
    stop = threading.Event()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = _rss_bytes()
        peak[0] = base

        def sample() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], _rss_bytes())
                time.sleep(0.002)

        watcher = threading.Thread(target=sample, daemon=True)
        watcher.start()
    t0 = time.perf_counter()
    tokens = run(prompts, args.new_tokens)
    seconds = time.perf_counter() - t0
    if cuda:
        torch.cuda.synchronize()
        used = torch.cuda.max_memory_allocated() - base
    else:
        stop.set()
        watcher.join()
        used = max(peak[0], resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024) - base
    vocab = int(model.get_output_embeddings().weight.shape[0])
    print(json.dumps({"peak_bytes": int(used), "tokens": tokens, "seconds": seconds, "vocab": vocab}))


def _child(args: argparse.Namespace, model_dir: str, path: str, new_tokens: int) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--measure",
        path,
        "--model",
        model_dir,
        "--batch",
        str(args.batch),
        "--prompt-tokens",
        str(args.prompt_tokens),
        "--new-tokens",
        str(new_tokens),
        "--device",
        args.device,
    ]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def memory(args: argparse.Namespace) -> None:
    """Peak memory of the HF backend before/after at a 151,936-token vocabulary; see the module docstring."""
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model
        if model_dir is None:
            model, tok = load_policy(build_tiny_policy(f"{tmp}/tiny"))
            model.resize_token_embeddings(QWEN_VOCAB, mean_resizing=False)
            model_dir = f"{tmp}/tiny_qwen_vocab"
            model.save_pretrained(model_dir)
            tok.save_pretrained(model_dir)
        after = _child(args, model_dir, "after", args.new_tokens)
        before_at = sorted(set(args.before_tokens or [args.new_tokens]))
        before = {t: _child(args, model_dir, "before", t) for t in before_at}
    gb = 1e9
    print(
        f"HF backend, one call: {args.batch} prompts x ~{args.prompt_tokens} prompt tokens -> {args.new_tokens} "
        f"new tokens, vocabulary {after['vocab']:,}, {args.device}"
    )
    print(
        f"after  (own decoding loop, [B, V] per step): peak {after['peak_bytes'] / gb:7.3f} GB "
        f"({after['tokens']} tokens, {after['seconds']:.1f} s)"
    )
    for t, r in before.items():
        print(
            f"before (stacked logits, B x T x V) at {t:4d} new tokens: peak {r['peak_bytes'] / gb:7.3f} GB "
            f"({r['tokens']} tokens, {r['seconds']:.1f} s)"
        )
    if args.new_tokens in before:
        full, how = before[args.new_tokens]["peak_bytes"], "measured"
    else:
        if len(before) < 2:
            raise SystemExit("--before-tokens: give two lengths to extrapolate from, or the full length")
        (t1, r1), (t2, r2) = list(before.items())[-2:]
        slope = (r2["peak_bytes"] - r1["peak_bytes"]) / (t2 - t1)
        full, how = r2["peak_bytes"] + slope * (args.new_tokens - t2), "extrapolated linearly"
    stacked = args.batch * args.new_tokens * after["vocab"] * 4 / gb
    print(
        f"before at {args.new_tokens} new tokens ({how}): {full / gb:.2f} GB "
        f"(the stacked fp32 logits alone: {stacked:.2f} GB)"
    )
    print(f"ratio before / after: {full / after['peak_bytes']:.0f}x")


# ----------------------------------------------------------------------------------------- vLLM memory shares
QWEN25 = {  # parameters; layers, KV heads, head dim (the models' config.json)
    "Qwen2.5-1.5B": (1.54e9, 28, 2, 128),
    "Qwen2.5-7B": (7.62e9, 28, 4, 128),
}


def vllm_memory(args: argparse.Namespace) -> None:
    """The arithmetic behind the one-GPU memory shares in gagpo_rllib/policy/generation/vllm.py."""
    from gagpo_rllib.policy.generation.vllm import engine_memory_gb, kv_cache_bytes_per_token, memory_share

    gpu, max_len = args.gpu_gb, args.max_model_len
    print(f"one {gpu:.0f} GB GPU, max_model_len {max_len}, bf16 engines, ~2 GB engine overhead each")
    for name, (params, layers, kv_heads, head_dim) in QWEN25.items():
        kv = kv_cache_bytes_per_token(layers, kv_heads, head_dim)
        print(f"{name}: KV cache {kv / 1024:.0f} KiB per token")
        for role, seqs in (
            ("training engine", args.train_sequences),
            ("evaluation engine", args.eval_sequences),
        ):
            m = engine_memory_gb(
                num_params=params,
                num_layers=layers,
                num_kv_heads=kv_heads,
                head_dim=head_dim,
                sequences=seqs,
                max_model_len=max_len,
            )
            print(
                f"  {role:17s} ({seqs:3d} sequences): weights {m['weights']:5.1f} GB + KV {m['kv_cache']:5.1f} GB "
                f"+ overhead {m['overhead']:.1f} GB = {m['total']:5.1f} GB -> gpu_memory_utilization "
                f"{memory_share(m['total'], gpu):.2f}"
            )
        print(
            f"  learner (one, DDP): fp32 masters, gradients and Adam {params * 16 / 1e9:5.1f} GB + bf16 reference "
            f"{params * 2 / 1e9:4.1f} GB, before activations (per GPU with FSDP: benchmarks/bench_memory.py)"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model folder; default: a tiny offline policy")
    ap.add_argument("--batch", type=int, default=None, help="prompts per call (16; 64 with --memory)")
    ap.add_argument("--prompt-tokens", type=int, default=300)
    ap.add_argument("--new-tokens", type=int, default=None, help="new tokens (32; 256 with --memory)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--memory", action="store_true", help="peak memory before/after (see above)")
    ap.add_argument("--before-tokens", type=int, nargs="+", default=None, help="lengths for the stacked path")
    ap.add_argument("--vllm-memory", action="store_true", help="print the vLLM memory-share arithmetic")
    ap.add_argument("--gpu-gb", type=float, default=80.0)
    ap.add_argument("--max-model-len", type=int, default=2048 + 256)
    ap.add_argument("--train-sequences", type=int, default=64)
    ap.add_argument("--eval-sequences", type=int, default=16)
    ap.add_argument("--measure", choices=["before", "after"], default=None, help=argparse.SUPPRESS)
    ap.add_argument("--backends", action="store_true", help="hf against vllm side by side (see above)")
    ap.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend-child", nargs=2, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--engine-start", action="store_true", help="vLLM engine start, AOT cache on vs off")
    ap.add_argument("--starts", type=int, default=3, help="engine starts per setting (--engine-start)")
    ap.add_argument("--engine-start-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    big = args.memory or args.measure
    args.batch = args.batch or (64 if big else 16)
    args.new_tokens = args.new_tokens or (256 if big else 32)
    if args.backend_child:
        _backend_child(args)
    elif args.engine_start_child:
        _engine_start_child(args)
    elif args.engine_start:
        engine_start(args)
    elif args.backends:
        backends(args)
    elif args.measure:
        args.path = args.measure
        _measure(args)
    elif args.memory:
        memory(args)
    elif args.vllm_memory:
        vllm_memory(args)
    else:
        throughput(args)


if __name__ == "__main__":
    main()
