"""The SGLang scorer: per-token log-probs of given tokens through SGLang's ``return_logprob``.

SGLang scores tokens it is given when a generate request asks ``return_logprob=True`` with a
``logprob_start_len``: the answer's ``meta_info["input_token_logprobs"]`` then holds one
``(logprob, token_id, text_or_None)`` per input token from ``logprob_start_len`` on, the first
with logprob ``None`` (SGLang's scheduler prepends it: nothing before it in the window predicts
it). So the request starts the window one token before the completion, at the prompt's last
token, and the completion's log-probs are the entries after it. The request says
``temperature=1.0`` (SGLang may scale input log-probs by the request's temperature; at 1 that is
the raw distribution) and ``max_new_tokens=1`` (one throw-away token). One ``score`` call is one
batch request (``input_ids`` a list of lists), one batch as far as SGLang's scheduler is
concerned. Works with an in-process ``sglang.Engine`` (``Engine.generate(**request)``) or any
callable that takes the request dict and returns SGLang's answer list (e.g. a POST of it as
JSON to a server's ``/generate``). SGLang is never imported here.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from precision_plugin._base.boundary import Invalid, Validator, checked
from precision_plugin._core.scoring.interface import TokenSequence
from precision_plugin.errors import PrecisionConfigError

#: The sampling parameters of a scoring request: one throw-away token at temperature 1.
SAMPLING_PARAMS: dict[str, Any] = {"max_new_tokens": 1, "temperature": 1.0}


@checked
def logprob_start(sequence: TokenSequence) -> int:
    """``logprob_start_len`` for ``sequence``: its prompt's last token (whose entry SGLang
    returns with logprob ``None``), so the entries after it are the completion's."""
    if not sequence.prompt_ids:
        raise PrecisionConfigError(
            "SGLangScorer was asked to score a sequence with an empty prompt; SGLang returns no "
            "log-prob for the first input token, so the completion's first token would have "
            "none. Give every canary sequence at least one prompt token (e.g. BOS)."
        )
    return len(sequence.prompt_ids) - 1


@checked
def generate_request(sequences: Sequence[TokenSequence]) -> dict[str, Any]:
    """The keyword arguments of ``Engine.generate`` (the JSON body of ``/generate``) that score
    ``sequences`` in one batch (field names of SGLang's ``GenerateReqInput``)."""
    return {
        "input_ids": [[*s.prompt_ids, *s.completion_ids] for s in sequences],
        "sampling_params": dict(SAMPLING_PARAMS),
        "return_logprob": True,
        "logprob_start_len": [logprob_start(s) for s in sequences],
    }


def _entries(value: Any) -> Any:
    """SGLang's ``input_token_logprobs``: ``(logprob, token_id, text)`` entries, ``logprob`` a
    number or ``None``, ``token_id`` a whole number >= 0 (``text`` optional)."""
    for i, entry in enumerate(value):
        shape = "is not a (logprob, token_id, text) entry"
        if isinstance(entry, (str, bytes)) or not isinstance(entry, Sequence):
            raise Invalid(f"holds {entry!r} at [{i}], which {shape}; {_ENTRY_FIX}")
        if not 2 <= len(entry) <= 3:
            raise Invalid(
                f"holds {entry!r} at [{i}], which {shape} ({len(entry)} items); {_ENTRY_FIX}"
            )
        logprob, token = entry[0], entry[1]
        number = isinstance(logprob, numbers.Real) and not isinstance(logprob, bool)
        if logprob is not None and not number:
            raise Invalid(
                f"holds {entry!r} at [{i}], whose logprob {logprob!r} is not a number or None; "
                f"{_ENTRY_FIX}"
            )
        whole = isinstance(token, numbers.Integral) or (
            isinstance(token, float) and token.is_integer()
        )
        if isinstance(token, bool) or not whole or token < 0:
            raise Invalid(
                f"holds {entry!r} at [{i}], whose token id {token!r} is not a whole number >= 0; "
                f"{_ENTRY_FIX}"
            )
    return value


_ENTRY_FIX = "pass meta_info['input_token_logprobs'] of SGLang's answer as it is"
#: SGLang's ``meta_info["input_token_logprobs"]``, each entry checked.
TOKEN_LOGPROBS = Validator(
    "SGLang's (logprob, token_id, text) entries", _entries, ([[]], [[0.5]], [["x", 1, "a"]])
)


@checked(input_token_logprobs=TOKEN_LOGPROBS)
def completion_logprobs(
    input_token_logprobs: Sequence[Sequence[Any]], sequence: TokenSequence
) -> list[float]:
    """The completion tokens' log-probs out of SGLang's ``meta_info["input_token_logprobs"]``
    for a request with ``logprob_start_len=logprob_start(sequence)``: ``(logprob, token_id,
    text)`` entries, the first for the prompt's last token (logprob ``None``). Each entry's
    token id must be the completion's token at that place."""
    entries = list(input_token_logprobs)
    want = [sequence.prompt_ids[-1] if sequence.prompt_ids else None, *sequence.completion_ids]
    got = [int(e[1]) for e in entries]
    if got != want:
        raise PrecisionConfigError(
            f"SGLang's input_token_logprobs cover tokens {got[:6]}... ({len(got)} entries), "
            f"expected the prompt's last token and the completion, {want[:6]}... "
            f"({len(want)}); send the request generate_request() builds (return_logprob=True, "
            f"logprob_start_len at the prompt's last token) and pass that request's answer."
        )
    out = []
    for entry in entries[1:]:
        if entry[0] is None:
            raise PrecisionConfigError(
                f"SGLang returned no log-prob for completion token {entry[1]}; only the first "
                f"entry of the window may be None. Check logprob_start_len."
            )
        out.append(float(entry[0]))
    return out


def _engine(value: Any) -> Any:
    if not callable(getattr(value, "generate", value)):
        raise Invalid(
            "has no generate() and is not callable; pass an sglang.Engine or a function that "
            "sends a /generate request dict and returns SGLang's answer list"
        )
    return value


ENGINE = Validator("an sglang.Engine or a function that sends a request", _engine, (42, "x"))


@checked(engine=ENGINE)
class SGLangScorer:
    """[`Scorer`][precision_plugin._core.scoring.Scorer] over SGLang: an ``sglang.Engine`` (its
    ``generate``) or a callable that sends a request dict and returns SGLang's answers."""

    name = "sglang"

    def __init__(self, engine: Any) -> None:
        send = getattr(engine, "generate", engine)
        self._send: Callable[..., Any] = send
        self._keywords = send is not engine  # Engine.generate takes the fields as keywords

    def score(self, sequences: Sequence[TokenSequence]) -> list[list[float]]:
        """Per-token log-probs of each completion, read from ``input_token_logprobs``."""
        if not sequences:
            return []
        request = generate_request(sequences)
        answers = self._send(**request) if self._keywords else self._send(request)
        if isinstance(answers, Mapping):  # a batch of one may come back unwrapped
            answers = [answers]
        if len(answers) != len(sequences):
            raise PrecisionConfigError(
                f"SGLang answered {len(answers)} results to a batch of {len(sequences)} "
                f"scoring requests; pass an engine that answers one result per input."
            )
        return [
            completion_logprobs(_input_token_logprobs(answer), s)
            for answer, s in zip(answers, sequences, strict=True)
        ]


def _input_token_logprobs(answer: Any) -> Any:
    """``answer["meta_info"]["input_token_logprobs"]``, or one error saying what came back."""
    meta = answer.get("meta_info") if isinstance(answer, Mapping) else None
    found = meta.get("input_token_logprobs") if isinstance(meta, Mapping) else None
    if found is None:
        keys = sorted(meta if isinstance(meta, Mapping) else answer if isinstance(answer, Mapping)
                      else [])  # fmt: skip
        raise PrecisionConfigError(
            f"SGLang's answer has no meta_info['input_token_logprobs'] (got "
            f"{type(answer).__name__} with keys {keys[:8]}); send the request generate_request() "
            f"builds (return_logprob=True) to an SGLang that returns log-probs."
        )
    return found
