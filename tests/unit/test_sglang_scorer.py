"""The SGLang scorer on answers shaped as SGLang's tokenizer manager returns them (no SGLang)."""

from __future__ import annotations

import pytest

from precision_plugin._core.scoring import Scorer, TokenSequence
from precision_plugin._core.scoring.sglang import (
    SGLangScorer,
    completion_logprobs,
    generate_request,
    logprob_start,
)
from precision_plugin.errors import PrecisionConfigError

SEQ = TokenSequence((5, 6, 9), (7, 8))


def window(seq: TokenSequence, logprobs: list[float]) -> list[tuple]:
    """``meta_info['input_token_logprobs']`` for ``logprob_start_len`` at the prompt's last
    token: ``(None, last, None)`` first, then ``(logprob, token, None)`` per completion token."""
    return [(None, seq.prompt_ids[-1], None)] + [
        (lp, tok, None) for lp, tok in zip(logprobs, seq.completion_ids, strict=True)
    ]


def test_the_request_starts_the_window_at_the_prompts_last_token() -> None:
    other = TokenSequence((1,), (4, 4, 4))
    assert generate_request([SEQ, other]) == {
        "input_ids": [[5, 6, 9, 7, 8], [1, 4, 4, 4]],
        "sampling_params": {"max_new_tokens": 1, "temperature": 1.0},
        "return_logprob": True,
        "logprob_start_len": [2, 0],
    }


def test_completion_logprobs_skip_the_none_entry() -> None:
    assert completion_logprobs(window(SEQ, [-1.25, -2.0]), SEQ) == [-1.25, -2.0]
    texts = [(None, 9, "x"), (-0.5, 7, "a"), (-0.25, 8, "b")]  # return_text_in_logprobs
    assert completion_logprobs(texts, SEQ) == [-0.5, -0.25]


def test_a_window_of_other_tokens_is_refused() -> None:
    shifted = [(None, 6, None), (-0.1, 9, None), (-1.25, 7, None), (-2.0, 8, None)]
    with pytest.raises(PrecisionConfigError, match=r"expected the prompt's last token"):
        completion_logprobs(shifted, SEQ)  # logprob_start_len one too early
    with pytest.raises(PrecisionConfigError, match=r"no log-prob for completion token 8"):
        completion_logprobs([(None, 9, None), (-1.0, 7, None), (None, 8, None)], SEQ)


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ((), r"\(0 items\)"),
        ((-0.5,), r"\(1 items\)"),
        ("abc", r"item \[2\] is str"),
        (("x", 7, None), "logprob 'x' is not a number or None"),
        ((-0.5, -7, None), "token id -7 is not a whole number"),
        ((-0.5, 7.5, None), "token id 7.5 is not a whole number"),
    ],
)
def test_a_malformed_entry_is_refused_naming_the_parameter(entry: tuple, why: str) -> None:
    answer = [*window(SEQ, [-0.5, -1.0])[:2], entry]
    with pytest.raises(PrecisionConfigError, match=rf"argument 'input_token_logprobs' .*{why}"):
        completion_logprobs(answer, SEQ)


def test_an_empty_prompt_is_refused() -> None:
    with pytest.raises(PrecisionConfigError, match=r"at least one prompt token"):
        logprob_start(TokenSequence((), (3,)))


class FakeEngine:
    """``Engine.generate(**kwargs)``: one answer per input, log-prob -0.5 * token id."""

    def __init__(self) -> None:
        self.requests: list[dict] = []

    def generate(self, **request: object) -> list[dict]:
        self.requests.append(request)
        out = []
        for ids, start in zip(request["input_ids"], request["logprob_start_len"], strict=True):
            entries = [(None, ids[start], None)] + [(-0.5 * t, t, None) for t in ids[start + 1 :]]
            out.append({"text": "", "meta_info": {"input_token_logprobs": entries}})
        return out


def test_the_scorer_over_an_engine_and_over_a_callable() -> None:
    engine = FakeEngine()
    scorer = SGLangScorer(engine)
    assert isinstance(scorer, Scorer) and scorer.name == "sglang"
    seqs = [SEQ, TokenSequence((1,), (3,))]
    assert scorer.score(seqs) == [[-3.5, -4.0], [-1.5]]
    assert len(engine.requests) == 1  # one call: one batch
    sent: list[dict] = []

    def post(request: dict) -> list[dict]:
        sent.append(request)
        return FakeEngine().generate(**request)

    assert SGLangScorer(post).score([SEQ]) == [[-3.5, -4.0]]
    assert sent == [generate_request([SEQ])]
    assert SGLangScorer(post).score([]) == []


def test_a_wrong_number_of_answers_and_a_non_engine_are_refused() -> None:
    with pytest.raises(PrecisionConfigError, match=r"answered 1 results to a batch of 2"):
        SGLangScorer(lambda request: FakeEngine().generate(**request)[:1]).score([SEQ, SEQ])
    with pytest.raises(PrecisionConfigError, match=r"has no generate\(\)"):
        SGLangScorer(42)


def test_an_answer_without_input_token_logprobs_is_refused_by_name() -> None:
    scorer = SGLangScorer(lambda request: [{"text": "x", "meta_info": {"id": "1"}}])
    with pytest.raises(PrecisionConfigError, match=r"no meta_info\['input_token_logprobs'\].*"
                       r"keys \['id'\]"):  # fmt: skip
        scorer.score([TokenSequence(prompt_ids=[1, 2], completion_ids=[3])])
