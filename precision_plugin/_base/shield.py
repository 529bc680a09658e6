"""Code that runs inside a user's training loop never stops training, except on purpose.

The plugin's callbacks, telemetry and detectors run inside ``train()``. What they raise is
either a deliberate refusal the user asked for (a strict-mode precision error:
[`PrecisionMismatchError`][precision_plugin.errors.PrecisionMismatchError],
[`ForwardOverflowError`][precision_plugin.errors.ForwardOverflowError],
[`LossScaleAtMinimumError`][precision_plugin.errors.LossScaleAtMinimumError], or any
[`PrecisionPluginError`][precision_plugin.errors.PrecisionPluginError] under
``strictness="error"``), which stops the run, or a problem of the plugin's own measurement (an
unexpected tensor shape, a framework that changed), which must not: it is logged as one warning
per kind of problem and per process, and what failed is skipped (the metric is not logged, the
check not made). ``KeyboardInterrupt`` and ``SystemExit`` always pass.

```python
with shielded("the train/rollout mismatch of this batch", policy.strictness):
    accumulator.add(train_logps, rollout_logps, mask)
```
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from precision_plugin.errors import (
    ForwardOverflowError,
    LossScaleAtMinimumError,
    PrecisionMismatchError,
    PrecisionPluginError,
)

log = logging.getLogger("precision_plugin")

#: Errors that stop training whatever the strictness: each exists only because the policy said
#: to stop (``strictness="error"``, ``loss_scaler.on_min_scale="error"``).
STOPS_TRAINING: tuple[type[BaseException], ...] = (
    PrecisionMismatchError,
    ForwardOverflowError,
    LossScaleAtMinimumError,
)

_lock = threading.Lock()
_warned: set[str] = set()


def stops_training(exc: BaseException, strictness: str = "warn") -> bool:
    """True when ``exc``, raised by the plugin inside ``train()``, should stop the run."""
    if not isinstance(exc, Exception):
        return True  # KeyboardInterrupt, SystemExit: the user's (or the system's) stop
    if isinstance(exc, STOPS_TRAINING):
        return True
    return strictness == "error" and isinstance(exc, PrecisionPluginError)


@contextmanager
def shielded(what: str, strictness: str = "warn") -> Iterator[None]:
    """Run the block; an exception that should not stop training (see the module docstring) is
    logged once per ``what`` and swallowed: the block is skipped from where it failed."""
    try:
        yield
    except BaseException as exc:
        if stops_training(exc, strictness):
            raise
        warn_once(what, exc)


def warn_once(what: str, exc: BaseException) -> None:
    """Log ``exc`` as the warning that ``what`` was skipped, once per ``what`` and process."""
    with _lock:
        if what in _warned:
            log.debug("precision_plugin: %s skipped again: %s", what, exc)
            return
        _warned.add(what)
    log.warning(
        "precision_plugin: %s is skipped (%s: %s); training goes on. This warning is given "
        "once; later failures of the same kind are logged at debug level.",
        what,
        type(exc).__name__,
        " ".join(str(exc).split()),
    )


def forget_warnings() -> None:
    """Give every warning again (for tests, and after ``disable()``)."""
    with _lock:
        _warned.clear()
