"""One offline vLLM engine in its own process: what it runs, what the plugin says of it, and
sampled tokens with their raw log-probs.

``offline.py CONFIG`` (JSON): ``model``; ``llm`` (extra ``LLM(...)`` kwargs); ``engine_kwargs``
(a policy: the kwargs go through ``precision_plugin.vllm.engine_kwargs`` first); ``prompts``
(token-id lists) and ``tokens`` (new tokens each, EOS ignored). Prints ``RESULT {json}`` last.
"""

import json
import sys
import time


def main(config: dict) -> dict:
    start = time.perf_counter()
    from vllm import LLM, SamplingParams

    kwargs = {"model": config["model"], "max_model_len": 512, "seed": 0, "enforce_eager": True}
    kwargs.update(config.get("llm", {}))
    if config.get("engine_kwargs"):
        from precision_plugin.vllm import engine_kwargs

        kwargs = engine_kwargs(kwargs, config["engine_kwargs"])
    llm = LLM(**kwargs)
    built = time.perf_counter()
    prompts = config["prompts"]
    params = [
        SamplingParams(
            max_tokens=config["tokens"], ignore_eos=True, logprobs=0, temperature=1.0, seed=1000 + i
        )
        for i in range(len(prompts))
    ]
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    generated = time.perf_counter()
    samples = []
    for prompt, output in zip(prompts, outputs, strict=True):
        completion = output.outputs[0]
        tokens = list(completion.token_ids)
        logps = [completion.logprobs[i][t].logprob for i, t in enumerate(tokens)]
        samples.append({"prompt": prompt, "tokens": tokens, "logprobs": logps})

    from precision_plugin.vllm import verify_engine

    engine = llm.llm_engine.vllm_config
    return {
        "dtype": str(engine.model_config.dtype),
        "kwargs": {k: v for k, v in kwargs.items() if isinstance(v, (str, int, float, bool))},
        "additional_config": dict(engine.additional_config or {}),
        "disable_cascade_attn": engine.model_config.disable_cascade_attn,
        "logprobs_mode": str(engine.model_config.logprobs_mode),
        "verify": {
            dtype: [[f.status, f.message] for f in verify_engine(llm, dtype)]
            for dtype in ("float16", "bfloat16", "float32")
        },
        "samples": samples,
        "build_seconds": built - start,
        "generate_seconds": generated - built,
    }


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(json.loads(sys.argv[1]))), flush=True)
