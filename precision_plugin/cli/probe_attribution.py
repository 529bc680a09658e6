"""``precision-plugin probe --attribute``'s options, beside the ``probe`` command
(``cli/probe.py`` adds them to its parser): ``--attribute``, ``--rollout``, ``--learning-rate``
and ``--attribution-plot``, what they become (the probe's ``attribution`` setting) and the
figure written after the run. The learning rate's default is the library's
(``probe.attribution.settings.DEFAULT_LEARNING_RATE``, which ``AttributionSettings`` also reads)."""

from __future__ import annotations

import argparse
from typing import Any

from precision_plugin.errors import PrecisionConfigError
from precision_plugin.probe.attribution.settings import (
    DEFAULT_LEARNING_RATE,
    ROLLOUT_KEYS,
    AttributionSettings,
    parse_rollout,
)


def add_attribution_options(parser: argparse.ArgumentParser) -> None:
    """``--attribute``, ``--rollout KEY=VALUE,...`` and ``--learning-rate`` on ``parser``."""
    parser.add_argument(
        "--attribute",
        action="store_true",
        help="also measure what each cause adds to the mismatch (dtype, decode, batch, "
        "lm_head, sampling, rope, kv_cache, router, stale_weights) on the same tokens",
    )
    parser.add_argument(
        "--rollout",
        action="append",
        metavar="KEY=VALUE,...",
        help="the rollout's own settings, under vLLM's names ("
        + ", ".join(ROLLOUT_KEYS)
        + "); applied to the rollout side and attributed (implies --attribute); may be "
        "repeated, a key at most once in all",
    )
    parser.add_argument(
        "--learning-rate",
        type=_learning_rate,
        default=None,
        metavar="LR",
        help="learning rate of the one Adam step the stale_weights row measures "
        f"(default: {DEFAULT_LEARNING_RATE:g})",
    )
    parser.add_argument(
        "--attribution-plot",
        metavar="FILE.png",
        help="with --attribute: write the figure of the mismatch by cause (needs matplotlib)",
    )


def _learning_rate(text: str) -> float:
    """A number in (0, 1], refused as the user typed it (``float('1e400')`` is inf)."""
    import math

    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= 1):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number in (0, 1]; pass the rate you train at, e.g. "
            f"--learning-rate {DEFAULT_LEARNING_RATE:g} (the default)"
        )
    return value


def write_attribution_plot(args: argparse.Namespace, result: Any, model: str) -> str | None:
    """Write ``--attribution-plot`` (after the run); returns the path written, or ``None``."""
    if args.attribution_plot is None or result.attribution is None:
        return None
    from precision_plugin.probe.attribution.plot import plot_attribution

    try:
        plot_attribution(result.attribution.to_dict(), args.attribution_plot,
                         title=f"why it is still off: {model}")  # fmt: skip
    except OSError as exc:
        raise PrecisionConfigError(
            f"--attribution-plot: cannot write {args.attribution_plot!r}: "
            f"{exc.strerror or exc}; pass a path in a folder that exists and is writable."
        ) from None
    return str(args.attribution_plot)


def attribution_settings(args: argparse.Namespace) -> AttributionSettings | None:
    """The probe's ``attribution`` setting from the parsed options (``None``: not asked)."""
    if not args.attribute and args.rollout is None:
        # Options that only mean something with an attribution are refused, not ignored.
        for option, value, what in (
            ("--attribution-plot", args.attribution_plot, "there is no attribution to draw"),
            ("--learning-rate", args.learning_rate, "it sets the stale_weights row's step"),
        ):
            if value is not None:
                raise PrecisionConfigError(
                    f"{option}: {what} without --attribute; add --attribute (or --rollout "
                    f"KEY=VALUE,...), or drop {option}."
                )
        return None
    rollout = None
    if args.rollout is not None:
        for piece in args.rollout:
            if not piece.replace(",", "").strip():
                parse_rollout(piece)  # refuses it: names no setting
        # Repeated --rollout options add up; a key in two of them is "given twice".
        rollout = parse_rollout(",".join(args.rollout))
    rate = DEFAULT_LEARNING_RATE if args.learning_rate is None else args.learning_rate
    if rollout is None:
        return AttributionSettings(learning_rate=rate)
    return AttributionSettings(rollout=rollout, learning_rate=rate)
