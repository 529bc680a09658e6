"""The probe's inputs: the device, the model folder, the prompts and their completion budgets."""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

import annotated_types as at

from precision_plugin._base import userfiles
from precision_plugin._base.boundary import (
    Invalid,
    Validator,
    at_least,
    checked,
    device_problem,
    duck,
    non_empty,
)
from precision_plugin._base.constraints import Whole
from precision_plugin._core.decision import MAX_NUM_PROMPTS
from precision_plugin._core.hf_engine import (  # noqa: F401 - the two named here as before
    TOKENIZER_FILES,
    checkpoint_folder,
    looks_like_hub_id,
)
from precision_plugin.errors import PrecisionConfigError
from precision_plugin.policy import UserJSONError, parse_json

#: What the prompt builders tokenize with.
_TOKENIZER = duck("__call__", "decode", what="a transformers tokenizer (AutoTokenizer)")

log = logging.getLogger("precision_plugin")

#: The built-in prompts are cut to one common length of at most this many tokens (a user's
#: ``--prompts`` file is used as written).
MAX_PROMPT_TOKENS = 48

#: One chat message: ``{"role": ..., "content": ...}``.
Message = Mapping[str, Any]
#: A prompt: plain text, or a chat (a sequence of messages) rendered by the chat template.
Prompt = str | Sequence[Message]

#: How many completions a prompt builder makes: 1 .. ``MAX_NUM_PROMPTS`` (``--num-prompts``'s
#: range), refused at the boundary before any prompt is tokenized.
NumPrompts = Annotated[int, Whole(), at.Ge(1), at.Le(MAX_NUM_PROMPTS)]


def _prompt_problem(prompt: Any) -> str | None:
    """Why ``prompt`` is no prompt (text, or a non-empty list of messages with text content)."""
    if isinstance(prompt, str):
        return None
    if isinstance(prompt, Mapping) or not isinstance(prompt, Sequence):
        return f"is {type(prompt).__name__}, neither text nor a chat (a list of messages)"
    if not prompt:
        return "is an empty chat (a list of no messages)"
    for number, message in enumerate(prompt, 1):
        if not isinstance(message, Mapping) or not isinstance(message.get("content"), str):
            return (
                f"is a chat whose message {number} is not a {{'role': ..., 'content': '...'}} "
                f"dict with text content"
            )
    return None


def _check_prompts(prompts: Any) -> Any:
    if not isinstance(prompts, str) and isinstance(prompts, Sequence) and len(prompts) == 0:
        raise Invalid("is empty; pass at least one prompt")
    for number, prompt in enumerate(prompts, 1):
        problem = _prompt_problem(prompt)
        if problem is not None:
            raise Invalid(
                f"holds a prompt that is not one: prompt {number} {problem}; a prompt is text "
                f"or a list of {{'role': ..., 'content': '...'}} messages"
            )
    return prompts


#: The user's prompts: at least one, each text or a non-empty chat of messages with text.
_PROMPTS = Validator(
    "at least one prompt: text, or a list of {'role', 'content'} messages",
    _check_prompts,
    ([], [[]], [{}], [[{"role": "user"}]]),
)

PROMPTS: tuple[str, ...] = (
    "The history of the printing press begins in the fifteenth century, when",
    "To compute the derivative of a product of two functions, we first",
    "Once upon a time, in a village at the edge of a great forest, there lived",
    "The main difference between a list and a tuple in Python is that",
    "Photosynthesis converts light energy into chemical energy. In the first stage,",
    "Question: A train travels 120 km in 1.5 hours. What is its average speed? Answer:",
    "Dear hiring committee, I am writing to apply for the position of",
    "The recipe calls for two cups of flour, one egg and a pinch of salt. First,",
    "In reinforcement learning, the policy gradient theorem states that",
    "Here is a short poem about the sea at night, written in free verse:",
    "The three laws of motion formulated by Isaac Newton describe",
    "def fibonacci(n):\n    # return the n-th Fibonacci number\n    if n < 2:",
    "Solve for x: 3x + 7 = 22. First subtract seven from both sides, which gives",
    "The city council met on Tuesday to discuss the new budget, which",
    "A good unit test should be fast, isolated and repeatable, because",
    "Translate to French: 'The weather is beautiful today.' Translation:",
)


@checked
def resolve_device(device: str) -> str:
    """Turn ``"auto"`` into ``cuda``/``cpu``; refuse a device torch cannot use here."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    problem = device_problem(device)
    if problem is not None:
        raise PrecisionConfigError(
            f"device: {device!r} cannot be used: {problem}; pass --device cpu, a device this "
            f"machine has "
            f"(cuda, cuda:1, mps, xpu) or auto."
        )
    return device


@checked
def check_model_dir(path: str | os.PathLike[str]) -> Path:
    """Check that ``path`` is a local HF checkpoint folder (with ``config.json``)."""
    return checkpoint_folder(path)


@checked(tokenizer=_TOKENIZER)
def build_prompts(tokenizer: Any, num_prompts: NumPrompts) -> list[list[int]]:
    """Tokenize the built-in prompts (cycled to ``num_prompts``), all cut to one length.

    The pad token id is removed from every prompt: an engine that derives an attention mask
    from ``input_ids != pad_token_id`` would mask it while a full forward would not (a fake
    float32 mismatch of ~3e-3 in an early version). Equal lengths mean no padding anywhere.
    """
    pad = getattr(tokenizer, "pad_token_id", None)
    encoded = []
    for i in range(num_prompts):
        ids = list(tokenizer(PROMPTS[i % len(PROMPTS)]).input_ids)
        encoded.append([t for t in ids if t != pad])
    length = min(MAX_PROMPT_TOKENS, *(len(p) for p in encoded))
    if length < 1:
        raise PrecisionConfigError(
            "model: its tokenizer encodes the probe prompts to no tokens; the probe needs a "
            "tokenizer that encodes plain English text."
        )
    return [p[:length] for p in encoded]


@checked(path=non_empty("the path of a prompts file"))
def read_prompts_file(path: str | os.PathLike[str]) -> list[Prompt]:
    """Read a prompts file: JSONL, a JSON array, or plain text, one prompt per line (blank lines
    skipped); a UTF-8 byte-order mark is ignored.

    The file is JSONL when its first non-blank line starts with ``{``: every line is an object
    with a ``prompt`` (text, or a list of chat messages as in TRL's conversational datasets) or
    a ``messages`` list of ``{"role", "content"}`` dicts (one of the two, not both). A file that
    starts with ``[`` is a JSON array of such objects or of prompt strings, unless its first line
    is text such as ``[INST] ...`` or ``[1, 2] is a list``. Otherwise each line is one prompt;
    lines end at ``\n`` only.
    """
    path = os.fspath(path)  # named as given in every message
    # The one reader: a path the OS can take, a regular file (a FIFO or /dev/zero refused
    # before opening) within the data size limit, UTF-8 (a bad byte named with its offset).
    text = userfiles.read_text(path, "prompts:", userfiles.MAX_DATA_BYTES, bom=True)
    text = text.replace("\r\n", "\n").replace("\r", "\n")  # as universal newlines read it
    # Lines end at "\n" only ("\r\n" and "\r" turned into "\n" above): splitlines() would
    # also split at a form feed, \x1c-\x1e, \x85, U+2028 and U+2029 inside a prompt.
    lines = [(n, line) for n, line in enumerate(text.split("\n"), 1) if line.strip()]
    if not lines:
        raise PrecisionConfigError(
            f"prompts: {path!r} holds no prompt; write one prompt per line, or JSONL lines "
            f'such as {{"prompt": "..."}} or '
            f'{{"messages": [{{"role": "user", "content": "..."}}]}}.'
        )
    first = lines[0][1].lstrip()
    if first.startswith("["):
        array = _json_array(path, text)
        if array is not None:
            return array
    if not first.startswith("{"):
        return [line for _, line in lines]
    return [_jsonl_prompt(path, n, line) for n, line in lines]


def _json_array(path: str, text: str) -> list[Prompt] | None:
    """The prompts of a JSON-array file; ``None`` when the file is text that starts with ``[``
    (``[INST] ...`` or ``[1, 2] is a list`` prompts)."""
    body = text.lstrip()
    if not re.match(r'\[\s*($|["{\[\]\d-])', body):
        return None  # "[INST] ..." is text
    first_line = body.split("\n", 1)[0]
    try:
        _, end = json.JSONDecoder().raw_decode(first_line)
    except (json.JSONDecodeError, RecursionError):
        pass  # not one whole value on the first line: an array over lines, or a broken one
    else:
        if first_line[end:].strip():
            return None  # "[1, 2] is a list ...": text that starts with a JSON value
    try:
        data = parse_json(text)
    except UserJSONError as exc:
        raise PrecisionConfigError(f"prompts: {path!r}: {exc}.") from None
    except json.JSONDecodeError as exc:
        raise PrecisionConfigError(
            f"prompts: {path!r} looks like a JSON array but is not valid JSON ({exc.msg} at "
            f"line {exc.lineno}); fix it, or write the prompts as JSONL lines "
            f'{{"prompt": "..."}}.'
        ) from None
    if not isinstance(data, list) or not data:
        raise PrecisionConfigError(
            f"prompts: {path!r} is a JSON {type(data).__name__ if data else 'empty array'}; "
            f'write a JSON array of prompts such as ["...", {{"prompt": "..."}}], or JSONL.'
        )
    return [
        item if isinstance(item, str) and item.strip() else _record_prompt(path, i, item)
        for i, item in enumerate(data, 1)
    ]


def _jsonl_prompt(path: str, number: int, line: str) -> Prompt:
    where = f"prompts: {path!r} line {number}"
    try:
        record = parse_json(line)
    except UserJSONError as exc:
        raise PrecisionConfigError(f"{where}: {exc}.") from None
    except json.JSONDecodeError as exc:
        raise PrecisionConfigError(
            f"{where} is not JSON ({exc.msg}); the file is read as JSONL because its first "
            f"line starts with '{{', so every line must be one JSON object."
        ) from None
    return _record_prompt(path, number, record, where)


def _record_prompt(path: str, number: int, record: Any, where: str = "") -> Prompt:
    where = where or f"prompts: {path!r} item {number}"
    if isinstance(record, dict) and "messages" in record and "prompt" in record:
        raise PrecisionConfigError(
            f'{where} has both a "messages" and a "prompt" field; a record gives its one prompt '
            f"in one of the two: keep one of them."
        )
    value = record.get("messages", record.get("prompt")) if isinstance(record, dict) else None
    if isinstance(value, str) and value.strip():
        return value
    if (
        isinstance(value, list)
        and value
        and all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in value)
    ):
        return value
    raise PrecisionConfigError(
        f'{where} has no usable prompt; each line needs a non-empty "prompt" string, or a '
        f'"prompt" or "messages" list of {{"role": ..., "content": "..."}} messages.'
    )


@checked(tokenizer=_TOKENIZER, prompts=_PROMPTS)
def encode_prompts(
    tokenizer: Any, prompts: Sequence[Prompt], num_prompts: NumPrompts
) -> list[list[int]]:
    """Tokenize the user's prompts (cycled to ``num_prompts``), each at its own length.

    Text is encoded as the tokenizer does by default (its BOS where it adds one). A chat is
    rendered with the tokenizer's chat template and the generation prompt, then encoded without
    adding special tokens again (the template writes them), as TRL does; without a chat
    template the messages are joined as ``role: content`` lines and a warning is logged.
    Prompts of different lengths are batched with left padding by the engines.
    """
    encoded = []
    warned = False
    for i in range(num_prompts):
        prompt = prompts[i % len(prompts)]
        if isinstance(prompt, str):
            ids = list(tokenizer(prompt).input_ids)
        else:
            messages = [dict(m) for m in prompt]
            if getattr(tokenizer, "chat_template", None):
                text = _chat_text(tokenizer, messages, i % len(prompts) + 1)
            else:
                if not warned:
                    log.warning(
                        "probe: the tokenizer has no chat template; chat prompts are written as "
                        "'role: content' lines"
                    )
                    warned = True
                text = "".join(f"{m.get('role', 'user')}: {m['content']}\n" for m in messages)
                text += "assistant:"
            ids = list(tokenizer(text, add_special_tokens=False).input_ids)
        if not ids:
            raise PrecisionConfigError(
                f"prompts: prompt {i % len(prompts) + 1} encodes to no tokens with this "
                f"model's tokenizer; remove it or check the tokenizer files."
            )
        encoded.append(ids)
    return encoded


def _chat_text(tokenizer: Any, messages: list[dict[str, Any]], number: int) -> str:
    """``messages`` rendered by the chat template; its Jinja errors as one-line refusals."""
    from jinja2 import TemplateError, TemplateSyntaxError

    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except TemplateSyntaxError as exc:
        raise PrecisionConfigError(
            f"model: its chat_template is not valid Jinja ({exc.message}); fix it in "
            f"tokenizer_config.json / chat_template.jinja, or use plain-text prompts."
        ) from None
    except TemplateError as exc:  # raise_exception() in the template, or a runtime error
        raise PrecisionConfigError(
            f"prompts: prompt {number}: the model's chat template refused it "
            f"({exc.message or type(exc).__name__}); fix the messages' roles/content or use "
            f"plain-text prompts."
        ) from None


@checked(max_new_tokens=at_least(1))
def completion_budgets(num_prompts: NumPrompts, max_new_tokens: int) -> list[int]:
    """Per-completion length caps spread evenly up to ``max_new_tokens`` (for the length fit)."""
    return [max(1, math.ceil(max_new_tokens * (i + 1) / num_prompts)) for i in range(num_prompts)]


# -- the trainer path ------------------------------------------------------------------------
