"""A ``--prompts`` file read as its writer meant it: line breaks, text that starts with ``[``,
records with two prompts, and chat templates that refuse a chat (a bad-input sweep)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from precision_plugin.errors import PrecisionConfigError
from precision_plugin.probe import encode_prompts, read_prompts_file
from precision_plugin.probe.tiny_model import build_tokenizer

USER = {"role": "user", "content": "2+2?"}
BANANA = {"role": "banana", "content": "peel me"}


def read(tmp_path: Path, text: str) -> list:
    file = tmp_path / "p.txt"
    file.write_bytes(text.encode("utf-8"))  # bytes: no newline translation on write
    return read_prompts_file(str(file))


def refusal(tmp_path: Path, text: str) -> str:
    file = tmp_path / "p.txt"
    file.write_bytes(text.encode("utf-8"))
    with pytest.raises(PrecisionConfigError) as caught:
        read_prompts_file(str(file))
    return str(caught.value).replace(repr(str(file)), "FILE")


# -- 1. lines end at "\n" only --------------------------------------------------------------


@pytest.mark.parametrize("inside", ["\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"])
def test_a_unicode_line_separator_stays_inside_its_prompt(tmp_path: Path, inside: str) -> None:
    # Before: str.splitlines() split "first prompt<FF>second half" into two prompts.
    text = f"first prompt{inside}second half\nthird\n"
    assert read(tmp_path, text) == [f"first prompt{inside}second half", "third"]


def test_a_jsonl_string_may_hold_a_raw_line_separator(tmp_path: Path) -> None:
    # Before: refused as "line 1 is not JSON (Unterminated string starting at)", the line was
    # cut at the raw U+2028 inside the JSON string.
    text = '{"prompt": "a\u2028b"}\n{"prompt": "c\u2029d"}\n'
    assert read(tmp_path, text) == ["a\u2028b", "c\u2029d"]


def test_crlf_lines_lose_their_carriage_return(tmp_path: Path) -> None:
    assert read(tmp_path, "one\r\ntwo\r\n\r\nthree\r\n") == ["one", "two", "three"]
    assert read(tmp_path, '{"prompt": "a"}\r\n{"prompt": "b"}\r\n') == ["a", "b"]


# -- 2. text that starts with "[" is not a broken JSON array ----------------------------------


@pytest.mark.parametrize(
    "first",
    [
        "[1, 2, 3] is a Python list. Its length is",
        "[0] indexing starts",
        "[-1] is the last item of",
        '["a", "b"] are two strings and',
        "[] is an empty list, so",
    ],
)
def test_text_that_starts_with_a_json_value_is_one_prompt_per_line(
    tmp_path: Path, first: str
) -> None:
    # Before: refused as "looks like a JSON array but is not valid JSON (Extra data at line 1)".
    assert read(tmp_path, f"{first}\nsecond prompt\n") == [first, "second prompt"]


def test_a_json_array_over_lines_is_still_an_array(tmp_path: Path) -> None:
    chat = '{"messages": [{"role": "user", "content": "2+2?"}]}'
    text = f'[\n  "Hi",\n  {{"prompt": "Yo"}},\n  {chat}\n]\n'
    assert read(tmp_path, text) == ["Hi", "Yo", [USER]]
    assert read(tmp_path, '["Hi", "Yo"]\n') == ["Hi", "Yo"]


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('[\n  "Hi",\n  "Yo"\n', "Expecting ',' delimiter at line 4"),  # the closing "]" is missing
        ('[\n  "Hi"\n  "Yo"\n]\n', "Expecting ',' delimiter at line 3"),
        ('["Hi", "Yo"\n]]\n', "Extra data at line 2"),  # one "]" too many
        ("[0]\nsecond prompt\n", "Extra data at line 2"),  # a whole line of JSON, then more
    ],
)
def test_a_broken_json_array_is_refused(tmp_path: Path, text: str, where: str) -> None:
    assert refusal(tmp_path, text) == (
        f"prompts: FILE looks like a JSON array but is not valid JSON ({where}); fix it, or "
        f'write the prompts as JSONL lines {{"prompt": "..."}}.'
    )


# -- 3. a record gives one prompt -------------------------------------------------------------

BOTH = (
    'has both a "messages" and a "prompt" field; a record gives its one prompt in one of the '
    "two: keep one of them."
)


@pytest.mark.parametrize(
    "record",
    [
        '{"messages": [{"role": "user", "content": "2+2?"}], "prompt": "other"}',
        '{"messages": [], "prompt": "hi"}',  # before: "has no usable prompt"
        '{"prompt": "hi", "messages": "x"}',
    ],
)
def test_a_jsonl_line_with_messages_and_prompt_is_refused(tmp_path: Path, record: str) -> None:
    # Before: "messages" silently won over "prompt".
    assert refusal(tmp_path, f'{{"prompt": "fine"}}\n{record}\n') == f"prompts: FILE line 2 {BOTH}"


def test_a_json_array_item_with_messages_and_prompt_is_refused(tmp_path: Path) -> None:
    text = '["fine", {"messages": [{"role": "user", "content": "x"}], "prompt": "y"}]'
    assert refusal(tmp_path, text) == f"prompts: FILE item 2 {BOTH}"


# -- 4. a chat template that refuses a chat ---------------------------------------------------

NO_BANANAS = (
    "{% for m in messages %}"
    "{% if m['role'] == 'banana' %}{{ raise_exception('Unknown role: ' + m['role']) }}{% endif %}"
    "<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def test_a_chat_the_template_refuses_is_a_one_line_error() -> None:
    # Before: a jinja2.exceptions.TemplateError traceback from apply_chat_template.
    tokenizer = build_tokenizer()
    tokenizer.chat_template = NO_BANANAS
    with pytest.raises(PrecisionConfigError) as caught:
        encode_prompts(tokenizer, [[USER], [BANANA]], 2)
    assert str(caught.value) == (
        "prompts: prompt 2: the model's chat template refused it (Unknown role: banana); fix "
        "the messages' roles/content or use plain-text prompts."
    )
    (ids,) = encode_prompts(tokenizer, [[USER]], 1)  # the same template renders a good chat
    assert tokenizer.decode(ids) == "<user>2+2?\n<assistant>"


def test_a_chat_template_that_is_not_jinja_is_a_one_line_error() -> None:
    # Before: a jinja2.exceptions.TemplateSyntaxError traceback from apply_chat_template.
    tokenizer = build_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}"  # no endfor
    message = (
        "model: its chat_template is not valid Jinja (Unexpected end of template. Jinja was "
        "looking for the following tags: 'endfor' or 'else'. The innermost block that needs to "
        "be closed is 'for'.); fix it in tokenizer_config.json / chat_template.jinja, or use "
        "plain-text prompts."
    )
    with pytest.raises(PrecisionConfigError, match=re.escape(message)):
        encode_prompts(tokenizer, [[USER]], 1)
