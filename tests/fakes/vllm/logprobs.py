from vllm.outputs import Logprob  # noqa: F401  (kept at vllm.logprobs as in vLLM)
