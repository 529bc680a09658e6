"""The probe's ``--prompts`` file: plain lines, JSONL prompts and chats, and clear refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from precision_plugin.errors import PrecisionConfigError
from precision_plugin.probe import ProbeConfig, encode_prompts, read_prompts_file
from precision_plugin.probe.tiny_model import build_tokenizer

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]


def test_plain_text_is_one_prompt_per_line(tmp_path: Path) -> None:
    file = tmp_path / "prompts.txt"
    file.write_text("first prompt\n\n  second, {with braces}\nthird\n", encoding="utf-8")
    assert read_prompts_file(str(file)) == ["first prompt", "  second, {with braces}", "third"]


def test_jsonl_prompt_messages_and_conversational_prompt(tmp_path: Path) -> None:
    file = tmp_path / "prompts.jsonl"
    rows = [{"prompt": "plain"}, {"messages": CHAT}, {"prompt": CHAT[1:]}]
    file.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    assert read_prompts_file(str(file)) == ["plain", CHAT, CHAT[1:]]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "holds no prompt"),
        ('{"prompt": "ok"}\nnot json\n', "line 2 is not JSON"),
        ('{"text": "no prompt field"}\n', "line 1 has no usable prompt"),
        ('{"messages": [{"role": "user"}]}\n', "line 1 has no usable prompt"),
    ],
)
def test_bad_files_are_refused_with_the_line(tmp_path: Path, text: str, match: str) -> None:
    file = tmp_path / "prompts.jsonl"
    file.write_text(text, encoding="utf-8")
    with pytest.raises(PrecisionConfigError, match=match):
        read_prompts_file(str(file))


def test_a_missing_file_is_refused() -> None:
    with pytest.raises(PrecisionConfigError, match=r"prompts: '/no/such/prompts\.txt' does not"):
        read_prompts_file("/no/such/prompts.txt")


def test_text_keeps_its_own_length_and_cycles() -> None:
    tokenizer = build_tokenizer()
    encoded = encode_prompts(tokenizer, ["ab", "a much longer prompt"], 5)
    assert [len(p) for p in encoded] == [2, 20, 2, 20, 2]  # byte tokenizer: one token a byte
    assert encoded[0] == list(tokenizer("ab").input_ids)


def test_chat_uses_the_chat_template_with_the_generation_prompt() -> None:
    tokenizer = build_tokenizer()
    tokenizer.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    (ids,) = encode_prompts(tokenizer, [CHAT], 1)
    assert tokenizer.decode(ids) == "<system>Be brief.\n<user>2+2?\n<assistant>"


def test_chat_without_a_template_is_written_as_role_lines(caplog: pytest.LogCaptureFixture) -> None:
    tokenizer = build_tokenizer()
    (ids,) = encode_prompts(tokenizer, [CHAT], 1)
    assert tokenizer.decode(ids) == "system: Be brief.\nuser: 2+2?\nassistant:"
    assert "no chat template" in caplog.text


def test_config_checks_prompts_and_min_new_tokens() -> None:
    assert ProbeConfig(prompts=["a", "b"]).prompts == ("a", "b")
    with pytest.raises(PrecisionConfigError, match="prompts"):
        ProbeConfig(prompts="just a string")
    with pytest.raises(PrecisionConfigError, match="prompts"):
        ProbeConfig(prompts=[])
    assert ProbeConfig(max_new_tokens=64, min_new_tokens=64).min_new_tokens == 64
    with pytest.raises(PrecisionConfigError, match="min-new-tokens"):
        ProbeConfig(max_new_tokens=64, min_new_tokens=65)
    with pytest.raises(PrecisionConfigError, match="min-new-tokens"):
        ProbeConfig(min_new_tokens=-1)


def test_line_ends_are_read_as_universal_newlines(tmp_path: Path) -> None:
    """The one reader keeps bytes as written: "\r\n" and "\r" still end a line, as when the file
    was read in text mode, and a UTF-8 byte-order mark is dropped."""
    file = tmp_path / "prompts.txt"
    file.write_bytes(b"\xef\xbb\xbfone\r\ntwo\rthree\n")
    assert read_prompts_file(str(file)) == ["one", "two", "three"]


@pytest.mark.parametrize(
    ("prompts", "match"),
    [
        ([[]], "prompt 1 is an empty chat"),
        (["ok", [{"role": "user"}]], "prompt 2 is a chat whose message 1"),
        (["ok", [{"role": "user", "content": 5}]], "prompt 2 is a chat whose message 1"),
    ],
)
def test_a_prompt_that_is_no_prompt_is_refused_naming_prompts(prompts: list, match: str) -> None:
    with pytest.raises(PrecisionConfigError, match=match) as info:
        encode_prompts(build_tokenizer(), prompts, 2)
    assert "'prompts'" in str(info.value) and "\n" not in str(info.value)


def test_num_prompts_is_bounded_before_any_work() -> None:
    from precision_plugin.probe import build_prompts, completion_budgets
    from precision_plugin.probe.schema import MAX_NUM_PROMPTS

    tokenizer = build_tokenizer()
    for call in (
        lambda n: build_prompts(tokenizer, n),
        lambda n: encode_prompts(tokenizer, ["a"], n),
        lambda n: completion_budgets(n, 8),
    ):
        with pytest.raises(PrecisionConfigError, match=rf"'num_prompts'.*<= {MAX_NUM_PROMPTS}"):
            call(2**70)  # a hang before: the loop ran to it
        with pytest.raises(PrecisionConfigError, match="'num_prompts'"):
            call(0)
    assert len(completion_budgets(MAX_NUM_PROMPTS, 8)) == MAX_NUM_PROMPTS
