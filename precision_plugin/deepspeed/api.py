"""The public functions of the DeepSpeed config entry: each takes a policy in any documented form
(a policy, a dict of its keys, a dtype name or ``None``), resolves it once, here, and hands a
[`PrecisionPolicy`][precision_plugin.policy.PrecisionPolicy] to the pure translation of
``precision_plugin.deepspeed.config``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from precision_plugin._base.boundary import checked, fix_hint
from precision_plugin._core.manager import requested_policy, resolve_policy
from precision_plugin.deepspeed.config import load_config, section_policy, translated
from precision_plugin.policy import PrecisionPolicy

_AS_DICT = fix_hint(
    "pass the config as a dict; read a JSON file with precision_plugin.deepspeed.load_config(path) "
    "first"
)


def _governing(cfg: Mapping[str, Any], asked: PrecisionPolicy | None) -> PrecisionPolicy:
    """``cfg``'s section over the policy asked for (its dtype fixed), or over the defaults
    (``asked`` ``None``: nothing was asked for, the section's dtype is free)."""
    base = asked if asked is not None else PrecisionPolicy()
    return section_policy(cfg, base, requested=asked is not None)


@checked(cfg=_AS_DICT)
def config_policy(
    cfg: Mapping[str, Any], policy: PrecisionPolicy | Mapping[str, Any] | str | None = None
) -> PrecisionPolicy:
    """The policy that governs ``cfg``: base policy, then the config's ``precision_plugin`` keys.

    The base is ``policy`` when given, else the policy this process was asked to follow
    (``enable()``, then ``PRECISION_PLUGIN``), else the defaults. Keys of the section override the
    base, except ``dtype`` when the base was asked for: the dtype is one decision for the whole
    process (rollouts follow it too), so a different section dtype is coerced to the base dtype
    (strictness ``warn``) or refused (strictness ``error``).
    """
    return _governing(cfg, resolve_policy(policy) if policy is not None else requested_policy())


@checked(cfg=fix_hint("pass a dict, or a path to a DeepSpeed JSON config"))
def apply_config(
    cfg: Mapping[str, Any] | str | os.PathLike[str],
    policy: PrecisionPolicy | Mapping[str, Any] | str | None = None,
) -> dict[str, Any]:
    """Return a copy of DeepSpeed config ``cfg`` that runs the precision policy (``cfg`` untouched).

    ``cfg`` is a dict or a path to a JSON file. The governing policy comes from
    [`config_policy`][precision_plugin.deepspeed.config_policy] (``policy`` / the requested policy /
    defaults, then the config's ``"precision_plugin"`` section). For ``float16``: ``fp16.enabled``
    true with dynamic loss scaling from ``policy.loss_scaler`` (``loss_scale`` 0,
    ``initial_scale_power``, ``loss_scale_window``, ``hysteresis``, ``min_loss_scale``) and
    ``bf16.enabled`` false; for ``bfloat16`` the mirror image; for ``float32`` both off. ``"auto"``
    values of other keys stay for HF/Accelerate to fill. An explicit contradiction (bf16 enabled,
    ``fp16.enabled`` false, a static ``loss_scale``, ``torch_autocast`` in another dtype) is coerced
    with a warning naming the key (strictness ``warn``) or refused with
    [`PrecisionMismatchError`][precision_plugin.errors.PrecisionMismatchError] (``error``).
    """
    out = load_config(cfg)
    asked = resolve_policy(policy) if policy is not None else requested_policy()
    return translated(out, _governing(out, asked))


@checked(cfg=_AS_DICT)
def translate(
    cfg: Mapping[str, Any], policy: PrecisionPolicy | Mapping[str, Any] | str | None
) -> dict[str, Any]:
    """Return a copy of ``cfg`` rewritten for exactly ``policy`` (its section is not read again).

    [`apply_config`][precision_plugin.deepspeed.apply_config] is ``translate(cfg, config_policy(cfg,
    policy))``; call this one when the policy is already resolved.
    """
    return translated(cfg, resolve_policy(policy))
