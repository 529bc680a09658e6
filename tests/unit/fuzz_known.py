"""Findings of the type-driven fuzzer not yet fixed (``test_fuzz_types.py``): each key is the
call (``entry(param=<label>)``), each value what happens. The list only shrinks: a finding not
listed fails, and a listed one that no longer happens fails until it is taken off.
"""

KNOWN: dict[str, str] = {}
