"""Megatron-LM's precision rules, as a versioned table (Megatron is not installable here).

Read at NVIDIA/Megatron-LM ``d98e8a64ddf34856e74b24714e3bedb2f5a39553`` (2026-08-22),
``megatron/training/arguments.py`` ``validate_args``::

    1195    if args.fp16:
    1196        assert not args.bf16
    1197        args.params_dtype = torch.half
    ...
    1204    if args.bf16:
    1205        assert not args.fp16
    1206        args.params_dtype = torch.bfloat16

slime (THUDM/slime ``624b824a``) parses Megatron's arguments, then sets ``args.bf16 = not
args.fp16`` (``slime/backends/megatron_utils/arguments.py:157``, ``_set_default_megatron_args``)
*before* Megatron's ``validate_args`` runs (``slime/utils/arguments.py:1621-1638``): under slime
the pair does not fail, ``--fp16`` silently wins and ``--bf16`` is dropped. The reader refuses the
pair for both: under Megatron it is the program's own refusal, under slime a request that is
silently half ignored (which of the two was meant cannot be told).
"""

from __future__ import annotations

from precision_plugin._core.configs.reader import Pair

#: The Megatron-LM commit the rules were read at.
MEGATRON_COMMIT = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"

#: (rule, source line) of each Megatron precision rule.
RULES: dict[str, str] = {
    "--fp16 refuses --bf16": "megatron/training/arguments.py:1195-1197 (assert not args.bf16)",
    "--bf16 refuses --fp16": "megatron/training/arguments.py:1204-1206 (assert not args.fp16)",
    "slime: bf16 = not fp16": (
        "slime/backends/megatron_utils/arguments.py:157 (before validate_args)"
    ),
}

MEGATRON_PAIRS = (
    Pair(
        "fp16",
        "bf16",
        "Megatron-LM refuses the pair (validate_args: 'assert not args.bf16', "
        "megatron/training/arguments.py:1196 at d98e8a64); slime sets bf16 = not fp16 first "
        "(megatron_utils/arguments.py:157), so there --fp16 silently wins. Keep one: --fp16 "
        "trains float16, no flag (or --bf16 alone) bfloat16",
    ),
)
