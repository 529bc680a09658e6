"""The canary's SGLang scorer against real SGLang on CPU: the request it builds is a valid
``GenerateReqInput`` batch for ``Engine.generate``, and the answer it reads is shaped by
SGLang's own scheduler and tokenizer-manager code (the ``None`` first entry, the window from
``logprob_start_len``)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from types import SimpleNamespace

import sglang
from sglang.srt.managers.io_struct import GenerateReqInput

from precision_plugin._core.scoring import TokenSequence
from precision_plugin._core.scoring.sglang import (
    SGLangScorer,
    completion_logprobs,
    generate_request,
)


def engine_generate_parameters() -> set[str]:
    """The parameters of ``sglang.Engine.generate``, read from its source (importing the
    engine needs uvloop/setproctitle/uvicorn, which this CPU environment leaves out)."""
    source = Path(sglang.__file__).parent / "srt" / "entrypoints" / "engine.py"
    tree = ast.parse(source.read_text())
    engine = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Engine")
    generate = next(n for n in engine.body if getattr(n, "name", None) == "generate")
    args = generate.args
    return {a.arg for a in [*args.args, *args.kwonlyargs]} - {"self"}


SEQS = [TokenSequence((5, 6, 9), (7, 8)), TokenSequence((1,), (4, 3, 2))]


def test_the_request_uses_generate_req_inputs_fields_and_normalizes_as_a_batch() -> None:
    request = generate_request(SEQS)
    names = {f.name for f in dataclasses.fields(GenerateReqInput)}
    assert set(request) <= names
    assert set(request) <= engine_generate_parameters()
    obj = GenerateReqInput(**request)
    obj.normalize_batch_and_arguments()
    assert obj.batch_size == 2
    assert obj.return_logprob == [True, True]
    assert obj.logprob_start_len == [2, 0]
    one = obj[1]  # what the scheduler receives per sequence
    assert (one.input_ids, one.logprob_start_len, one.return_logprob) == ([1, 4, 3, 2], 0, True)
    assert one.sampling_params == {"max_new_tokens": 1, "temperature": 1.0}


def sglang_window(ids: list[int], start: int, raw: list[float]) -> list[tuple]:
    """``meta_info['input_token_logprobs']`` as SGLang builds it: the scheduler's
    ``_process_input_token_logprobs`` over the raw per-position log-probs, then the tokenizer
    manager's ``detokenize_logprob_tokens`` (no text)."""
    from sglang.srt.managers.scheduler_components.logprob_result_processor import (
        SchedulerLogprobResultProcessor,
    )
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    processor = SchedulerLogprobResultProcessor(model_config=SimpleNamespace(vocab_size=1000))
    req = SimpleNamespace(
        is_prefill_only=False, token_indices_to_pool=None, origin_input_ids=ids,
        logprob_start_len=start, logprob=SimpleNamespace(),
    )  # fmt: skip
    processor._process_input_token_logprobs(req, raw)
    vals, idx = req.logprob.input_token_logprobs_val, req.logprob.input_token_logprobs_idx
    return TokenizerManager.detokenize_logprob_tokens(None, vals, idx, False)


def test_the_scorer_reads_sglangs_own_window() -> None:
    seq = SEQS[0]
    ids = [*seq.prompt_ids, *seq.completion_ids]
    # raw log-probs from position start on: each predicts the next token, the last one the
    # token to sample (dropped by SGLang)
    raw = [-1.25, -2.0, -9.0]
    window = sglang_window(ids, 2, raw)
    assert window == [(None, 9, None), (-1.25, 7, None), (-2.0, 8, None)]
    assert completion_logprobs(window, seq) == [-1.25, -2.0]

    class Engine:
        def generate(self, **request):
            return [
                {"meta_info": {"input_token_logprobs": sglang_window(
                    ids, start, [-0.5 * t for t in ids[start + 1 :]] + [-9.0]
                )}}
                for ids, start in zip(request["input_ids"], request["logprob_start_len"], strict=True)
            ]  # fmt: skip

    assert SGLangScorer(Engine()).score(SEQS) == [[-3.5, -4.0], [-2.0, -1.5, -1.0]]
