"""One dtype vocabulary (``precision_plugin._base.dtypes``): every alias, case-insensitively, and
``torch.dtype`` objects name one of three precisions; every adapter's spelling table is derived
from it; comparisons of dtype names go through it (AReaL's ``half`` is float16)."""

from __future__ import annotations

import pytest
import torch

from precision_plugin import PrecisionConfigError, PrecisionPolicy
from precision_plugin._base.dtypes import (
    DTYPE_ALIASES,
    SUPPORTED_DTYPES,
    canonical_dtype_name,
    dtype_label,
    normalize_dtype,
    same_dtype,
    spellings,
    torch_dtype,
)
from precision_plugin._core.frameworks import SGLANG_DTYPE_CHOICES, sglang_runs
from precision_plugin.areal import check_areal_config
from precision_plugin.verl.layout import canonical_dtype

SPELLINGS = [
    ("float16", "float16"), ("fp16", "float16"), ("half", "float16"), ("HALF", "float16"),
    (" Half ", "float16"), ("FP16", "float16"), ("torch.float16", "float16"),
    (torch.float16, "float16"), (torch.half, "float16"), ("bfloat16", "bfloat16"),
    ("BF16", "bfloat16"), ("bf16", "bfloat16"), (torch.bfloat16, "bfloat16"),
    ("float32", "float32"), ("fp32", "float32"), ("float", "float32"), ("FLOAT", "float32"),
    (torch.float32, "float32"),
]  # fmt: skip


@pytest.mark.parametrize(("value", "canonical"), SPELLINGS)
def test_every_spelling_is_one_precision(value: object, canonical: str) -> None:
    assert normalize_dtype(value) == canonical
    assert canonical_dtype_name(value) == canonical
    assert same_dtype(value, canonical)
    assert PrecisionPolicy(dtype=value).dtype == canonical  # the policy reads the same table


@pytest.mark.parametrize("value", ["fp8", "auto", "", "int8", torch.int8, None, "float64"])
def test_other_values_are_refused_by_name(value: object) -> None:
    assert canonical_dtype_name(value) is None
    with pytest.raises(PrecisionConfigError, match="is not a supported precision"):
        normalize_dtype(value)


def test_labels_and_comparisons() -> None:
    assert dtype_label("torch.float64") == "float64"
    assert dtype_label(torch.int8) == "int8"
    assert same_dtype("half", torch.float16) and not same_dtype("bf16", "fp16")
    assert torch_dtype("Half") is torch.float16 and torch_dtype("BF16") is torch.bfloat16
    assert set(DTYPE_ALIASES.values()) == set(SUPPORTED_DTYPES)


def test_spelling_tables_derive_from_the_vocabulary() -> None:
    """A framework table is the vocabulary restricted to the names that framework accepts."""
    assert SGLANG_DTYPE_CHOICES == {
        "auto": None, "half": "float16", "float16": "float16", "bfloat16": "bfloat16",
        "float": "float32", "float32": "float32",
    }  # fmt: skip
    assert spellings(("fp16", "16")) == {"fp16": "float16", "16": "float16"}
    with pytest.raises(ValueError, match="'fp8' is not in"):
        spellings(("fp8",))


def test_framework_readers_agree() -> None:
    """verl, SGLang and the policy read the same names the same way."""
    for value, canonical in SPELLINGS:
        assert canonical_dtype(value) == canonical
    assert canonical_dtype(16) == "float16" and canonical_dtype("32") == "float32"
    assert sglang_runs(torch.float16) == "float16" and sglang_runs("half") == "float16"
    with pytest.raises(PrecisionConfigError, match="never 'fp16'"):
        sglang_runs("fp16")  # SGLang's parser refuses it: a framework table, not the vocabulary


@pytest.mark.parametrize(("spelling", "policy"), [("half", "float16"), ("BF16", "bfloat16")])
def test_areal_spelling_compares_equal(spelling: str, policy: str) -> None:
    """AReaL's ``actor.dtype: half`` trains in float16: no contradiction with a float16 policy
    (it was reported as 'trains in half' before the vocabulary)."""
    cfg = {
        "rollout": {"backend": "sglang:d4"},
        "actor": {"backend": "megatron:d4", "dtype": spelling, "path": ""},
        "sglang": {"dtype": policy, "kv_cache_dtype": "auto", "model_path": ""},
    }
    found = check_areal_config(cfg, policy)
    assert [f.status for f in found] == ["ok"], [f.message for f in found]
