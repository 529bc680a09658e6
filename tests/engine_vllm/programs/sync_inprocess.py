"""An in-process vLLM engine that receives weights the way TRL's colocate mode sends them
(``model.load_weights`` on the driver worker's model), checked against an HF learner given the
same edits with the plugin's post-sync check.

``sync_inprocess.py CONFIG`` (JSON): ``model``, ``dtype`` (the engine's), ``keep`` (true: the
plugin's ``keep_cpu_weights`` before the engine is built), ``break_plugin`` (true: the plugin's
entry-point module fails to import while vLLM loads it; ``verify_engine`` is asked after). Two edits, each pushed alone: a Linear
(``layers.0.mlp.down_proj`` x1.5) and the embedding (x0.5, tied to the LM head). Prints
``RESULT {json}`` last.
"""

import json
import os
import sys
import time

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process, as TRL's


def check(sync, engine, learner):
    from precision_plugin._core.canary.sync_check import check_sync
    from precision_plugin._core.scoring import HFScorer
    from precision_plugin._core.scoring.vllm import VLLMScorer

    rollout = VLLMScorer(engine).score(SEQUENCES)
    ours = HFScorer(learner, batch_size=4).score(SEQUENCES)
    result = check_sync(sync, rollout, ours, ours)  # float32 learner: it is the reference
    gap = max(
        abs(a - b) for r, o in zip(rollout, ours, strict=True) for a, b in zip(r, o, strict=True)
    )
    return {"ratio": result.ratio, "faulty": result.faulty, "engine_gap": result.engine_gap,
            "max_gap": gap, "message": result.message("float32")}  # fmt: skip


def push(engine, learner, name, value):
    """Load one tensor into the engine as TRL does; into the learner only when that worked."""
    model = engine.llm_engine.model_executor.driver_worker.model_runner.model
    try:
        model.load_weights([(name, value.clone())])
    except Exception as exc:  # what the user would see at TRL's first sync
        return f"{type(exc).__name__}: {exc}"
    import torch

    with torch.no_grad():
        learner.get_parameter(name).copy_(value)
    return None


class PlantedImportError:
    """A meta-path finder that fails the import of ``precision_plugin.vllm`` (the module of the
    plugin's ``vllm.general_plugins`` entry point), as a broken install would."""

    def find_spec(self, name, path=None, target=None):
        if name == "precision_plugin.vllm":
            raise ImportError("planted import error of precision_plugin.vllm")
        return None


def main(config):
    global SEQUENCES
    import torch
    from transformers import AutoModelForCausalLM

    from precision_plugin._base.patching import Patcher
    from precision_plugin._core.canary.sync_check import sync_sequences

    start = time.perf_counter()
    learner = AutoModelForCausalLM.from_pretrained(config["model"], dtype=torch.float32).eval()
    SEQUENCES = sync_sequences(learner.config.vocab_size)
    if config["keep"]:
        from precision_plugin.vllm.cpu_weights import keep_cpu_weights

        keep_cpu_weights(Patcher(owner="test"))
    blocker = None
    if config.get("break_plugin"):  # PRECISION_PLUGIN is set: vLLM tries to load the plugin
        blocker = PlantedImportError()
        sys.meta_path.insert(0, blocker)
    from vllm import LLM

    engine = LLM(
        model=config["model"], dtype=config["dtype"], max_model_len=256, enforce_eager=True, seed=0
    )
    verify = None
    if blocker is not None:
        sys.meta_path.remove(blocker)
        from precision_plugin.vllm import verify_engine

        verify = [[f.status, f.message] for f in verify_engine(engine, config["dtype"])]
    result = {"build_seconds": time.perf_counter() - start, "verify": verify}
    result["before"] = check(0, engine, learner)
    linear = "model.layers.0.mlp.down_proj.weight"
    result["linear_error"] = push(engine, learner, linear, learner.get_parameter(linear) * 1.5)
    result["after_linear"] = check(1, engine, learner)
    embedding = "model.embed_tokens.weight"
    result["embedding_error"] = push(
        engine, learner, embedding, learner.get_parameter(embedding) * 0.5
    )
    result["after_embedding"] = check(2, engine, learner)
    head = engine.llm_engine.model_executor.driver_worker.model_runner.model.lm_head
    result["head_linear"] = getattr(head, "cpu_linear", None).__class__.__name__
    return result


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(json.loads(sys.argv[1]))), flush=True)
