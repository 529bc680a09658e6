"""Bad inputs of the Python entry points found by a sweep, each accepted before without a word
or reported as something else; each test names what happened before. (The command line's are in
``BAD_ARGS`` of tests/integration/test_cli.py.)"""

from __future__ import annotations

import pytest

from precision_plugin import PrecisionConfigError


def test_bad_input_found_while_printing_is_not_an_output_error() -> None:
    # PrecisionConfigError is a ValueError, which writing_stdout read as a closed stdout.
    from precision_plugin.cli.process import writing_stdout

    with pytest.raises(PrecisionConfigError), writing_stdout():
        raise PrecisionConfigError("dtype: 'fp8' is not a supported precision")
