"""``precision_plugin.consequence``: its old public path. The code lives in
[`precision_plugin.metrics.consequence`][precision_plugin.metrics.consequence]; this module
is that same module object (``sys.modules`` alias), so every name, private ones included, and
every patch of one, are the same."""

import sys

from precision_plugin.metrics import consequence as _module

sys.modules[__name__] = _module
