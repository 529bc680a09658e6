"""The probe's inputs: the device, the model folder, the prompts and their completion budgets."""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from precision_plugin.boundary import at_least, checked, device_problem, duck, non_empty
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


# The files a tokenizer is loaded from (fast, sentencepiece, BPE and WordPiece vocabularies);
# without any of them transformers silently builds an empty tokenizer.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "spiece.model",
    "vocab.json",
    "vocab.txt",
)


# A Hub model id: "name" or "owner/name" (letters, digits, '-', '_', '.'; no path syntax).
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


def looks_like_hub_id(text: str) -> bool:
    """Whether ``text`` reads as a Hugging Face Hub id (``owner/name``) rather than a path."""
    return bool(_HUB_ID.fullmatch(text)) and ".." not in text and not text.startswith(".")


@checked
def check_model_dir(path: str | os.PathLike[str]) -> Path:
    """Check that ``path`` is a local HF checkpoint folder (with ``config.json``)."""
    folder = Path(path).expanduser()
    if not folder.exists() and looks_like_hub_id(str(path)):
        raise PrecisionConfigError(
            f"model: {path!r} does not exist as a local folder; it looks like a Hugging Face Hub "
            f"id, and the probe downloads nothing. Fetch the checkpoint once on a machine with "
            f"network: `hf download {path} --local-dir ./{Path(str(path)).name}` (the "
            f"huggingface_hub CLI; `huggingface-cli download` in versions before 1.0), or in "
            f"Python AutoModelForCausalLM.from_pretrained({str(path)!r}).save_pretrained(PATH) "
            f"and the same for AutoTokenizer; then pass --model with that folder."
        )
    if not folder.exists():
        raise PrecisionConfigError(
            f"model: {path!r} does not exist; pass a local HF checkpoint folder (config.json, "
            f"weights and tokenizer), or omit --model to probe the embedded default model."
        )
    if not folder.is_dir():
        raise PrecisionConfigError(
            f"model: {path!r} is a file, not a folder; pass the checkpoint folder that holds "
            f"config.json, the weights and the tokenizer."
        )
    if not (folder / "config.json").is_file():
        raise PrecisionConfigError(
            f"model: {path!r} has no config.json, so it is not an HF checkpoint; save one with "
            f"model.save_pretrained(PATH) and tokenizer.save_pretrained(PATH)."
        )
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise PrecisionConfigError(
            f"model: {path!r} has no tokenizer files (none of {', '.join(TOKENIZER_FILES)}); "
            f"the probe tokenizes its prompts with the checkpoint's tokenizer: save it there with "
            f"tokenizer.save_pretrained(PATH)."
        )
    return folder


@checked(tokenizer=_TOKENIZER, num_prompts=at_least(1))
def build_prompts(tokenizer: Any, num_prompts: int) -> list[list[int]]:
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
    file = Path(path).expanduser()
    try:
        text = file.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise PrecisionConfigError(
            f"prompts: cannot read {path!r} ({reason}); pass a UTF-8 text or JSONL file."
        ) from None
    # Lines end at "\n" only (read_text has turned "\r\n" and "\r" into "\n"): splitlines()
    # would also split at a form feed, \x1c-\x1e, \x85, U+2028 and U+2029 inside a prompt.
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


@checked(tokenizer=_TOKENIZER, prompts=non_empty("at least one prompt"), num_prompts=at_least(1))
def encode_prompts(tokenizer: Any, prompts: Sequence[Prompt], num_prompts: int) -> list[list[int]]:
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


@checked(num_prompts=at_least(1), max_new_tokens=at_least(1))
def completion_budgets(num_prompts: int, max_new_tokens: int) -> list[int]:
    """Per-completion length caps spread evenly up to ``max_new_tokens`` (for the length fit)."""
    return [max(1, math.ceil(max_new_tokens * (i + 1) / num_prompts)) for i in range(num_prompts)]


# -- the trainer path ------------------------------------------------------------------------
