"""The one boundary check of every public function and class (``@checked``), split by job:

- :mod:`~precision_plugin._base.boundary.checker`: the decorator (``checked``, ``self_checked``,
  ``boundary_of``), the :class:`Boundary` it keeps per function, and the result check
  (:class:`BrokenResult`);
- :mod:`~precision_plugin._base.boundary.validators`: the generic value checks (:class:`Validator`,
  ``in_range``, ``one_of``, ``policy_field``, ``dtype_name``, ...);
- :mod:`~precision_plugin._base.boundary.devices`: the device checks (``torch_device``,
  ``usable_device``, ``gpu_capability``, ``device_problem``);
- :mod:`~precision_plugin._base.boundary.relations`: the checks across parameters
  (``same_length``, ``same_rows``, ``same_shape``);
- :mod:`~precision_plugin._base.boundary.typecheck`: the type engine and the registered coercions;
- :mod:`~precision_plugin._base.boundary.fields`: the field checks of the config dataclasses.

This package re-exports the public names of those modules; a private helper is imported from
the module that defines it. :class:`~precision_plugin._base.constraints.Invalid` is the one
exception a validator or a declared rule raises.
"""

from __future__ import annotations

from precision_plugin._base.boundary.checker import (  # noqa: F401 (re-exported)
    SPEC_ATTR,
    Boundary,
    BrokenResult,
    boundary_of,
    checked,
    self_checked,
)
from precision_plugin._base.boundary.devices import (  # noqa: F401 (re-exported)
    device_problem,
    gpu_capability,
    torch_device,
    usable_device,
)
from precision_plugin._base.boundary.relations import (  # noqa: F401 (re-exported)
    Relation,
    same_length,
    same_rows,
    same_shape,
)
from precision_plugin._base.boundary.typecheck import (  # noqa: F401 (re-exported)
    COERCIONS,
    Coercion,
    register_coercion,
)
from precision_plugin._base.boundary.validators import (  # noqa: F401 (re-exported)
    Validator,
    at_least,
    dtype_like,
    dtype_name,
    duck,
    each,
    fix_hint,
    in_range,
    non_empty,
    numbers_1d,
    one_of,
    policy_arg,
    policy_field,
    positive,
    real_number,
    torch_module,
    version_text,
)
from precision_plugin._base.constraints import Invalid  # noqa: F401 (re-exported)

#: The checker is the package's own machinery, not public API (docs/api.md does not document
#: it): adapters import its names explicitly.
__all__: list[str] = []
