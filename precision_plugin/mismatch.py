"""``precision_plugin.mismatch``: its old public path. The code lives in
[`precision_plugin.metrics.mismatch`][precision_plugin.metrics.mismatch]; this module is that same
module object (``sys.modules`` alias), so every name, private ones included, and every patch of
one, are the same."""

import sys

from precision_plugin.metrics import mismatch as _module

sys.modules[__name__] = _module
