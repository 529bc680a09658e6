"""The causes a live vLLM engine can switch, one engine in its own process: the same tokens'
log-probs through its decode path and through its prefill path, in a batch and alone.

``causes.py CONFIG`` (JSON): ``model``, ``dtype``, ``prompts`` (token-id lists), ``tokens``
(new tokens each, EOS ignored), ``kv_cache_dtype`` (optional: the engine's KV cache). Prints
``RESULT {json}`` last with, per prompt: ``tokens`` (sampled, temperature 1, full vocabulary),
``decode`` (their raw log-probs as sampled: the decode path, the prompts batched together),
``prefill_batch`` (the same tokens rescored through ``prompt_logprobs``, all sequences in one
call) and ``prefill_alone`` (each sequence rescored in a call of its own).
"""

import json
import sys
import time


def rescore(llm, sequences, prompt_lengths, sampling):
    """Each sequence's completion log-probs from ``prompt_logprobs`` (one ``generate`` call)."""
    outputs = llm.generate([{"prompt_token_ids": s} for s in sequences], sampling, use_tqdm=False)
    rows = []
    for out, seq, start in zip(outputs, sequences, prompt_lengths, strict=True):
        rows.append([out.prompt_logprobs[i][seq[i]].logprob for i in range(start, len(seq))])
    return rows


def main(config: dict) -> dict:
    from vllm import LLM, SamplingParams

    start = time.perf_counter()
    kwargs = {"model": config["model"], "dtype": config["dtype"], "max_model_len": 1024,
              "seed": 0, "enforce_eager": True, "logprobs_mode": "raw_logprobs"}  # fmt: skip
    if config.get("kv_cache_dtype"):
        kwargs["kv_cache_dtype"] = config["kv_cache_dtype"]
    try:
        llm = LLM(**kwargs)
    except Exception as exc:  # e.g. a KV-cache dtype this build does not run
        return {"refused": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
    built = time.perf_counter()
    prompts = config["prompts"]
    params = [
        SamplingParams(
            max_tokens=config["tokens"], ignore_eos=True, logprobs=0, temperature=1.0, seed=1000 + i
        )
        for i in range(len(prompts))
    ]
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    decode = [
        [o.outputs[0].logprobs[i][t].logprob for i, t in enumerate(toks)]
        for o, toks in zip(outputs, tokens, strict=True)
    ]
    score = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=1)
    sequences = [p + t for p, t in zip(prompts, tokens, strict=True)]
    lengths = [len(p) for p in prompts]
    batch = rescore(llm, sequences, lengths, score)
    alone = [rescore(llm, [s], [n], score)[0] for s, n in zip(sequences, lengths, strict=True)]
    return {
        "dtype": str(llm.llm_engine.vllm_config.model_config.dtype),
        "kv_cache_dtype": str(llm.llm_engine.vllm_config.cache_config.cache_dtype),
        "prompts": prompts,
        "tokens": tokens,
        "decode": decode,
        "prefill_batch": batch,
        "prefill_alone": alone,
        "build_seconds": built - start,
        "seconds": time.perf_counter() - start,
    }


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(json.loads(sys.argv[1]))), flush=True)
