"""Parse a ``train_ppo_ray`` command line with the installed OpenRLHF's own parser.

OpenRLHF builds its parser inside ``if __name__ == "__main__":`` of
``openrlhf.cli.train_ppo_ray``, so it cannot be imported. The module is run as ``__main__``
(``runpy``) and stopped right after ``parser.parse_args()`` returns, before OpenRLHF's own
validation and ``train()``: nothing starts, no Ray cluster, no model. The module's imports
(vLLM, Ray, DeepSpeed, flash-attn) must be installed, as on any machine that runs OpenRLHF.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import runpy
import sys
from collections.abc import Sequence
from typing import Any

from precision_plugin._base.boundary import checked, non_empty
from precision_plugin._base.patching import Patcher
from precision_plugin.errors import PrecisionConfigError

MODULE = "openrlhf.cli.train_ppo_ray"


class _Parsed(BaseException):
    """Carries the parsed namespace out of the ``__main__`` block (not an error)."""

    def __init__(self, namespace: argparse.Namespace) -> None:
        super().__init__("parsed")
        self.namespace = namespace


def _called_from_main() -> bool:
    """True when the ``parse_args`` call comes from the ``__main__`` block being run."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__") in _OWN:
        frame = frame.f_back  # type: ignore[assignment]
    return frame is not None and frame.f_globals.get("__name__") == "__main__"


_OWN = (__name__, "precision_plugin._base.patching")


def _stop_after_parse(original: Any, self: argparse.ArgumentParser, *a: Any, **k: Any) -> Any:
    namespace = original(self, *a, **k)
    if _called_from_main():
        raise _Parsed(namespace)
    return namespace  # a parser of a module the command imports


@checked(module=non_empty("a module such as openrlhf.cli.train_ppo_ray"))
def parse_args(argv: Sequence[str], *, module: str = MODULE) -> Any:
    """Parse ``argv`` (the arguments after ``python -m openrlhf.cli.train_ppo_ray``) with the
    installed OpenRLHF's parser; return its namespace, nested by OpenRLHF's ``hierarchize``
    (``args.ds.param_dtype``) where the version has it.

    Raises [`PrecisionConfigError`][precision_plugin.errors.PrecisionConfigError] when the module
    cannot be imported or OpenRLHF's parser refuses ``argv`` (its own message included).
    """
    patcher = Patcher(owner="precision_plugin[openrlhf:parse]")
    patcher.around(
        argparse.ArgumentParser,
        "parse_args",
        _stop_after_parse,
        reason="OpenRLHF builds its parser under __main__; stop right after it parsed",
    )
    saved_argv = sys.argv
    sys.argv = [module, *argv]
    usage = io.StringIO()
    try:
        with contextlib.redirect_stderr(usage):
            runpy.run_module(module, run_name="__main__", alter_sys=False)
    except _Parsed as parsed:
        namespace = parsed.namespace
    except SystemExit:
        message = " ".join(usage.getvalue().strip().splitlines()[-1:]) or "no message"
        raise PrecisionConfigError(
            f"OpenRLHF's train_ppo_ray parser refused the arguments: {message}"
        ) from None
    except ImportError as exc:
        raise PrecisionConfigError(
            f"cannot import {module} to parse the arguments ({type(exc).__name__}: {exc}); run "
            f"this where OpenRLHF and its dependencies are installed"
        ) from None
    else:
        raise PrecisionConfigError(f"{module} finished without parsing any arguments")
    finally:
        sys.argv = saved_argv
        patcher.restore()
    try:
        from openrlhf.utils.config import hierarchize
    except ImportError:  # OpenRLHF < 0.10.2: flat names
        return namespace
    return hierarchize(namespace)
