"""The strict config reader: adversarial configs through every dialect (Hypothesis).

String booleans, typos of known keys, flags without their value, refused pairs and numbers
written as text go through each program's dialect; each is read as the program reads it or
refused with one message naming the program, the key and where it was read.
"""

from __future__ import annotations

import difflib
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from precision_plugin import PrecisionConfigError
from precision_plugin._core.configs import DIALECTS, Dialect, Key
from precision_plugin._core.configs.reader import TYPO_CUTOFF

PROPERTY = settings(max_examples=30, deadline=2000, derandomize=True)
SOURCE = "cfg.yaml"
ALL = list(DIALECTS.values())
ARGPARSE = [d for d in ALL if d.style == "argparse"]
TEXT_BOOLEANS = ["true", "false", "True", "FALSE", "yes", "no", "on", "off", "y", "n", "1", "0"]
#: OmegaConf 2.3 BooleanNode, written out independently of the reader (omegaconf/nodes.py).
OMEGACONF_BOOLEAN = {
    "true": True, "false": False, "True": True, "FALSE": False, "yes": True, "no": False,
    "on": True, "off": False, "y": True, "n": False, "1": True, "0": False,
}  # fmt: skip


def keys_of(kind: str) -> list[tuple[Dialect, Key]]:
    return [(d, k) for d in ALL for k in d.keys if k.kind == kind]


def message_of(call) -> str:
    with pytest.raises(PrecisionConfigError) as err:
        call()
    text = str(err.value)
    assert "\n" not in text
    return text


@pytest.mark.parametrize(
    ("dialect", "key"),
    keys_of("switch"),
    ids=lambda x: getattr(x, "path", getattr(x, "program", "")),
)
@PROPERTY
@given(text=st.sampled_from(TEXT_BOOLEANS))
def test_a_switch_written_as_text_is_read_as_the_program_reads_it(dialect, key, text):
    read = lambda: dialect.read_mapping({key.path: text}, SOURCE)
    if dialect.style == "structured":
        assert read() == {key.path: OMEGACONF_BOOLEAN[text]}
        return
    said = message_of(read)
    assert said.startswith(f"{dialect.program}: {key.path}") and f"in {SOURCE}" in said
    assert repr(text) in said


def _transpose(word: str, at: int) -> str:
    at %= len(word) - 1
    return word[:at] + word[at + 1] + word[at] + word[at + 2 :]


@pytest.mark.parametrize("dialect", ALL, ids=lambda d: d.program)
@PROPERTY
@given(data=st.data())
def test_a_typo_of_a_known_key_names_the_key(dialect, data):
    key = data.draw(st.sampled_from(dialect.keys), label="key")
    parent, _, leaf = key.path.rpartition(".")
    how = data.draw(st.sampled_from(["swap", "drop", "double"]), label="typo")
    at = data.draw(st.integers(0, 100), label="at") % len(leaf)
    if how == "swap" and len(leaf) > 2:
        typo = _transpose(leaf, at)
    elif how == "drop" and len(leaf) > 4:
        typo = leaf[:at] + leaf[at + 1 :]
    else:
        typo = leaf[:at] + leaf[at] + leaf[at:]
    path = f"{parent}.{typo}" if parent else typo
    siblings = [
        k.path.rpartition(".")[2] for k in dialect.keys if k.path.rpartition(".")[0] == parent
    ]
    if path in dialect.by_path or path in dialect.neighbours or typo == leaf:
        return
    near = difflib.get_close_matches(typo, siblings, n=1, cutoff=TYPO_CUTOFF)
    if not near:  # too far from every known key to be called its typo: not a key it reads
        assert dialect.read_mapping({path: "x"}, SOURCE) == {}
        return
    said = message_of(lambda: dialect.read_mapping({path: "x"}, SOURCE))
    assert f"{dialect.program}: {path} in {SOURCE}" in said
    assert f"did you mean '{parent + '.' if parent else ''}{near[0]}'" in said


@pytest.mark.parametrize("dialect", ARGPARSE, ids=lambda d: d.program)
@PROPERTY
@given(data=st.data())
def test_a_flag_without_its_value_is_refused(dialect, data):
    valued = [k for k in dialect.keys if k.kind != "switch"]
    if not valued:
        return
    key = data.draw(st.sampled_from(valued), label="key")
    follow = data.draw(st.sampled_from([[], ["--another-flag"], ["--", "x"]]), label="then")
    said = message_of(lambda: dialect.read_argv(["--lr", "1e-6", key.spelling(), *follow]))
    assert f"{key.spelling()} in the command line has no value" in said
    assert f"argument {key.spelling()}: expected one argument" in said


PAIRED = [d for d in ARGPARSE if d.pairs]


@pytest.mark.parametrize("dialect", PAIRED, ids=lambda d: d.program)
@PROPERTY
@given(data=st.data())
def test_a_refused_pair_is_refused_in_any_order_among_other_flags(dialect, data):
    pair = dialect.pairs[0]
    flags = [dialect.by_path[pair.first].spelling(), dialect.by_path[pair.second].spelling()]
    others = data.draw(st.lists(st.sampled_from(["--lr", "1e-6", "--seed", "3", "x"]), max_size=6))
    argv = data.draw(st.permutations([*flags, *others]), label="argv")
    said = message_of(lambda: dialect.read_argv(argv))
    assert "refuses the pair" in said and "arguments.py:1196" in said
    single = [a for a in argv if a != flags[1]]
    assert dialect.read_argv(single)[pair.first] is True


@pytest.mark.parametrize(
    ("dialect", "key"), keys_of("int"), ids=lambda x: getattr(x, "path", getattr(x, "program", ""))
)
@PROPERTY
@given(
    number=st.integers(-(10**6), 10**6), junk=st.text(string.ascii_letters, min_size=1, max_size=5)
)
def test_counts_are_read_as_the_program_reads_them(dialect, key, number, junk):
    if dialect.style in ("argparse", "structured"):  # int() of the text
        assert dialect.read_mapping({key.path: str(number)}, SOURCE) == {key.path: number}
    else:  # YAML or Python: a string is no number there
        assert "the string" in message_of(
            lambda: dialect.read_mapping({key.path: str(number)}, SOURCE)
        )
    assert dialect.read_mapping({key.path: number}, SOURCE) == {key.path: number}
    for bad in (junk, True, number + 0.5):
        said = message_of(lambda bad=bad: dialect.read_mapping({key.path: bad}, SOURCE))
        assert key.path in said and SOURCE in said


@pytest.mark.parametrize("dialect", ALL, ids=lambda d: d.program)
def test_a_key_the_plugin_does_not_read_is_left_alone(dialect):
    assert dialect.read_mapping({"completely_unrelated_setting": "x", "a": {"b": 1}}, SOURCE) == {}


def test_deep_mappings_are_read_without_recursion_limits():
    from precision_plugin._core.configs import VERL

    deep: dict = {}
    node = deep
    for _ in range(5000):
        node["n"] = {}
        node = node["n"]
    assert VERL.read_mapping(deep, SOURCE) == {}


def test_a_text_value_that_is_no_config_is_refused_at_the_boundary():
    from precision_plugin._core.configs import VERL

    said = message_of(lambda: VERL.read_mapping("ppo.yaml", SOURCE))
    assert "argument 'data'" in said and "load the file first" in said


def test_a_field_of_the_programs_own_config_object_is_never_a_typo():
    """verl builds its rollout section as a dataclass with a real ``moe_tensor_parallel_size``
    field, a near-spelling of the known ``tensor_model_parallel_size``: a dataclass's fields
    exist by definition and pass; the same key written in a mapping is still refused."""
    import dataclasses

    from precision_plugin._core.configs import VERL

    @dataclasses.dataclass
    class RolloutConfig:  # the shape of verl's (verl/workers/config/rollout.py)
        tensor_model_parallel_size: int = 2
        moe_tensor_parallel_size: int = 1

    read = VERL.read_mapping({"actor_rollout_ref": {"rollout": RolloutConfig()}}, "a section")
    assert read == {"actor_rollout_ref.rollout.tensor_model_parallel_size": 2}
    written = {"actor_rollout_ref": {"rollout": {"moe_tensor_parallel_size": 1}}}
    with pytest.raises(
        PrecisionConfigError, match=r"did you mean 'actor_rollout_ref\.rollout\.tensor_model"
    ):
        VERL.read_mapping(written, "ppo.yaml")


@pytest.mark.parametrize("source", ["", "  \t"])
def test_a_blank_source_label_is_refused_naming_source(source):
    """The label is what every message says the override came from ("'x' in  is not ...")."""
    from precision_plugin._core.configs import VERL, parse_override

    with pytest.raises(PrecisionConfigError, match=r"'source'.*empty"):
        parse_override("float16", VERL, source)
    assert parse_override("actor_rollout_ref.rollout.dtype=float16", VERL) == (
        "actor_rollout_ref.rollout.dtype",
        "float16",
    )


@pytest.mark.parametrize("program", ["", "  "])
def test_a_dialect_without_a_program_name_is_refused_naming_program(program):
    """Every message starts with the program's name (": 'x' in the overrides is not ...")."""
    import dataclasses

    from precision_plugin._core.configs import VERL

    with pytest.raises(PrecisionConfigError, match=r"'program'.*empty"):
        dataclasses.replace(VERL, program=program)
