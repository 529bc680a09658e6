"""The DeepSpeed ``"precision_plugin"`` config entry: pure translation into DeepSpeed's own keys.

A DeepSpeed config may carry a top-level section with the policy's keys::

    {"precision_plugin": {"dtype": "float16", "loss_scaler": {"growth_interval": 400}},
     "zero_optimization": {"stage": 2}}

[`apply_config`][precision_plugin.deepspeed.apply_config] returns a new config in which DeepSpeed's
``fp16`` / ``bf16`` / ``torch_autocast`` sections say what the policy says. Plugin keys never go
inside DeepSpeed's sections (DeepSpeed rejects unknown keys there); the ``precision_plugin`` section
itself is kept unchanged (DeepSpeed ignores unknown top-level keys, and keeping it makes the
function idempotent and lets a config copied later, e.g. TRL's reference model, carry the entry
along).

This module imports neither DeepSpeed nor torch, nor the plugin manager: every function here
takes a resolved [`PrecisionPolicy`][precision_plugin.policy.PrecisionPolicy]. The public
functions that accept a policy in any form and resolve it (``apply_config``, ``config_policy``,
``translate``) are in ``precision_plugin.deepspeed.api``.
"""

from __future__ import annotations

import copy
import json
import logging
import os
from collections.abc import Mapping
from typing import Any

from precision_plugin._base import userfiles
from precision_plugin._base.boundary import checked, fix_hint
from precision_plugin._base.conflicts import settle_conflict
from precision_plugin._core.frameworks import (
    DS_BF16,
    DS_FP16,
    deepspeed_autocast_flag,
    deepspeed_dynamic_scaling,
    deepspeed_enabled_sections,
    deepspeed_flag,
)
from precision_plugin.errors import PrecisionConfigError
from precision_plugin.policy import PrecisionPolicy, UserJSONError, normalize_dtype, parse_json

log = logging.getLogger("precision_plugin")

#: Name of the top-level DeepSpeed config section the plugin reads.
SECTION = "precision_plugin"

#: DeepSpeed's legacy alias of ``bf16`` and its autocast section.
_BF16_OLD, _AUTOCAST = "bfloat16", "torch_autocast"


@checked(cfg=fix_hint("pass a dict, or a path to a DeepSpeed JSON config"))
def load_config(cfg: Mapping[str, Any] | str | os.PathLike[str]) -> dict[str, Any]:
    """Return a deep copy of ``cfg``: a dict, a path to a JSON file, or a JSON string."""
    if isinstance(cfg, Mapping):
        userfiles.check_argument(cfg, "DeepSpeed config (cfg, a dict)")
        return copy.deepcopy(dict(cfg))
    text = os.fspath(cfg)
    if not text.lstrip().startswith(("{", "[")) and ("\0" in text or os.path.lexists(text)):
        data = _read_json_file(text)
    else:
        try:
            data = parse_json(text)
        except UserJSONError as exc:
            raise PrecisionConfigError(
                f"DeepSpeed config (JSON string): {exc} (DeepSpeed refuses such a config)."
            ) from None
        except json.JSONDecodeError:
            userfiles.check_path(text, "DeepSpeed config")  # a path the OS cannot take
            raise PrecisionConfigError(
                f"DeepSpeed config: {text!r} is neither an existing file nor JSON. Pass a "
                f"dict, a path to a DeepSpeed JSON config, or a JSON string."
            ) from None
    if not isinstance(data, dict):
        raise PrecisionConfigError(
            f"DeepSpeed config {text!r}: expected a JSON object, got {type(data).__name__}."
        )
    return data


def _read_json_file(path: str) -> Any:
    """Parse a JSON config file through the one reader (a regular file within the size limit,
    UTF-8, a key given twice refused, depth checked); every failure names the file."""
    return userfiles.read_json(path, "DeepSpeed config", note=" (DeepSpeed refuses such a config)")


def section_policy(
    cfg: Mapping[str, Any], base: PrecisionPolicy, *, requested: bool
) -> PrecisionPolicy:
    """The policy that governs ``cfg``: ``base``, then the config's ``precision_plugin`` keys.

    ``requested`` says that ``base`` was asked for (an argument, ``enable()``,
    ``PRECISION_PLUGIN``) rather than being the defaults. Keys of the section override the base,
    except ``dtype`` when the base was asked for: the dtype is one decision for the whole
    process (rollouts follow it too), so a different section dtype is coerced to the base dtype
    (strictness ``warn``) or refused (strictness ``error``).
    """
    _check_no_misspelled_section(cfg)
    if SECTION not in cfg:
        return base
    section = cfg[SECTION]
    if not isinstance(section, Mapping):
        raise PrecisionConfigError(
            f'DeepSpeed config "{SECTION}": expected an object with the policy\'s keys such as '
            f'{{"dtype": "float16"}}, got {section!r}.'
        )
    try:
        PrecisionPolicy.from_dict(section)  # validates keys and values with named messages
        merged = base.replace(**dict(section))
    except PrecisionConfigError as exc:
        raise PrecisionConfigError(f'DeepSpeed config "{SECTION}" section: {exc}') from None
    if requested and merged.dtype != base.dtype:
        settle_conflict(
            merged.strictness,
            f'DeepSpeed config "{SECTION}.dtype"={section.get("dtype")!r} contradicts the '
            f"active precision policy (dtype={base.dtype!r}); rollouts and learner must run "
            f"one dtype",
            fix=f"remove dtype from the section or make it {base.dtype!r}, or enable the "
            f"plugin with dtype={merged.dtype!r}",
            outcome=f"the learner follows the policy: {base.dtype}",
        )
        merged = merged.replace(dtype=base.dtype)
    return merged


def _check_no_misspelled_section(cfg: Mapping[str, Any]) -> None:
    """Refuse a top-level key that is the section's name misspelled (``"precision-plugin"``,
    ``"PrecisionPlugin"``, ``"precision_plugins"``): DeepSpeed ignores unknown top-level keys,
    so the policy in it would be dropped without a word."""
    import difflib

    def squashed(name: str) -> str:
        return "".join(c for c in name.lower() if c.isalnum())

    for key in cfg:
        if not isinstance(key, str) or key == SECTION:
            continue
        if squashed(key) == squashed(SECTION) or difflib.get_close_matches(
            key.lower(), [SECTION], n=1, cutoff=0.85
        ):
            raise PrecisionConfigError(
                f'DeepSpeed config key "{key}" is not "{SECTION}", the section precision_plugin '
                f"reads (DeepSpeed ignores unknown top-level keys, so its settings would be "
                + (
                    f'dropped); the config holds "{SECTION}" too: move its keys into '
                    f'"{SECTION}" and remove "{key}".'
                    if SECTION in cfg
                    else f'dropped); rename it to "{SECTION}".'
                )
            )


def translated(cfg: Mapping[str, Any], policy: PrecisionPolicy) -> dict[str, Any]:
    """A copy of ``cfg`` rewritten for exactly ``policy`` (its section is not read again)."""
    userfiles.check_argument(cfg, "DeepSpeed config (cfg, a dict)")  # before deepcopy recurses
    out = copy.deepcopy(dict(cfg))
    _Translator(out, policy).run()
    return out


#: The policy key each DeepSpeed scaler key is written from (for the message that replaces one).
_POLICY_KEY = {
    "initial_scale_power": "loss_scaler.init_scale",
    "loss_scale_window": "loss_scaler.growth_interval",
    "hysteresis": "loss_scaler.hysteresis",
    "min_loss_scale": "loss_scaler.min_scale",
}


def _section(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    value = cfg.get(name)
    if value is None:
        value = cfg[name] = {}
    if not isinstance(value, dict):
        raise PrecisionConfigError(
            f"DeepSpeed config {name!r}: expected an object, got {value!r}. Example: "
            f'"{name}": {{"enabled": true}}.'
        )
    return value


class _Translator:
    """Rewrites one (already copied) config dict in place for one policy."""

    def __init__(self, cfg: dict[str, Any], policy: PrecisionPolicy) -> None:
        self.cfg = cfg
        self.policy = policy

    def run(self) -> None:
        self._autocast()
        self._param_dtype()
        sections = deepspeed_enabled_sections(self.policy)
        for name in sorted(sections, key=lambda n: not sections[n]):  # the enabled one first
            if sections[name]:
                self._set_enabled(name, True)
            else:
                self._disable(name)
        if self.policy.dtype == "float16":
            self._fp16_scaler()
        self._master_weights()

    # -- conflicts ---------------------------------------------------------------------------
    def _conflict(self, key: str, found: Any, coerced: str, why: str = "") -> None:
        """Coerce (warn) or refuse (error) an explicit setting that contradicts the policy."""
        settle_conflict(
            self.policy.strictness,
            f"DeepSpeed config {key}={json.dumps(found)} contradicts the precision policy "
            f"(dtype={self.policy.dtype!r}){': ' + why if why else ''}",
            fix=f"set {coerced} (or remove {key}) in the DeepSpeed config, or use "
            f"strictness='warn' to let precision_plugin coerce it",
            outcome=f"precision_plugin set {coerced}",
        )

    # -- sections ----------------------------------------------------------------------------
    def _set_enabled(self, name: str, enabled: bool) -> None:
        section = _section(self.cfg, name)
        self._check_enabled(name, section.get("enabled"), enabled)
        section["enabled"] = enabled

    def _check_enabled(self, name: str, current: Any, enabled: bool) -> None:
        """Read ``current`` as DeepSpeed does; a contradiction (or a value DeepSpeed refuses)
        is settled by strictness."""
        if current in (None, "auto"):
            return
        found = deepspeed_flag(current)
        if found != enabled:
            why = (
                "" if found is not None else "DeepSpeed reads only true/false, 1/0, yes/no, on/off"
            )
            self._conflict(f"{name}.enabled", current, f"{name}.enabled={json.dumps(enabled)}", why)

    def _disable(self, name: str) -> None:
        if name == DS_BF16 and _BF16_OLD in self.cfg:
            legacy = _section(self.cfg, _BF16_OLD)
            self._check_enabled(_BF16_OLD, legacy.get("enabled"), False)
            legacy["enabled"] = False
            if name not in self.cfg:
                return  # DeepSpeed reads the legacy section only when "bf16" is absent
        self._set_enabled(name, False)

    def _fp16_scaler(self) -> None:
        fp16 = self.cfg[DS_FP16]
        settings = self.policy.loss_scaler
        if not settings.enabled:
            self._no_dynamic_scaling(fp16)
            return
        current = fp16.get("loss_scale")
        if current not in (None, "auto", 0, 0.0) or isinstance(current, bool):
            static = isinstance(current, (int, float)) and not isinstance(current, bool)
            self._conflict(
                "fp16.loss_scale",
                current,
                "fp16.loss_scale=0 (dynamic)",
                "a static loss scale cannot back off on overflow; the policy asks for dynamic "
                "scaling (set loss_scaler.enabled=false in the precision_plugin section to keep "
                "a static scale)"
                if static and current > 0
                else "it is no loss scale (DeepSpeed takes 0, dynamic, or a static scale > 0)",
            )
        wanted = deepspeed_dynamic_scaling(self.policy)
        for key, value in wanted.items():
            before = fp16.get(key)
            if key != "loss_scale" and before not in (None, "auto", value):
                # Not a contradiction of the dtype (strict runs go on), but the user's value
                # is replaced: said where it shows, not at INFO.
                log.warning(
                    "precision_plugin: DeepSpeed fp16.%s=%s is replaced by %s from the precision "
                    'policy; to change it, set it in the "precision_plugin" section (%s)',
                    key,
                    json.dumps(before),
                    json.dumps(value),
                    _POLICY_KEY.get(key, "loss_scaler"),
                )
            fp16[key] = value

    def _no_dynamic_scaling(self, fp16: dict[str, Any]) -> None:
        """``loss_scaler.enabled=false``: the user's static ``loss_scale`` stands; none given
        (or ``"auto"``) is 1, no scaling, as torch's disabled GradScaler does, since DeepSpeed
        reads a missing ``loss_scale`` as 0, its dynamic scaler."""
        current = fp16.get("loss_scale")
        if current in (0, 0.0) and not isinstance(current, bool):
            self._conflict(
                "fp16.loss_scale",
                current,
                "fp16.loss_scale=1 (no scaling)",
                "0 is DeepSpeed's dynamic scaling, and the policy has loss_scaler.enabled=false "
                "(set a static scale such as 1024, or enable the policy's scaler)",
            )
        if current in (None, "auto", 0, 0.0):
            fp16["loss_scale"] = 1

    def _autocast(self) -> None:
        section = self.cfg.get(_AUTOCAST)
        if not isinstance(section, dict) or not deepspeed_autocast_flag(section.get("enabled")):
            return
        raw = section.get("dtype")
        try:
            found = normalize_dtype(raw) if raw is not None else "bfloat16"
        except PrecisionConfigError:
            found = str(raw)
        if self.policy.dtype != "float32" and found == self.policy.dtype:
            # Same dtype, other mechanism: DeepSpeed's AMP mode cannot be combined with the
            # fp16/bf16 section (ZeRO-0 fails) and its GradScaler ignores the policy's settings.
            log.warning(
                "DeepSpeed config torch_autocast (dtype %s) replaced by DeepSpeed's %s section, "
                "which runs the policy's loss scaler; precision_plugin set "
                "torch_autocast.enabled=false.",
                found,
                "fp16" if found == "float16" else "bf16",
            )
        else:
            key = "torch_autocast.dtype" if raw is not None else "torch_autocast.enabled"
            shown = raw if raw is not None else True
            self._conflict(
                key,
                shown,
                "torch_autocast.enabled=false",
                f"torch_autocast would compute in {found}"
                + ("" if raw is not None else " (DeepSpeed's documented default)"),
            )
        section["enabled"] = False

    def _master_weights(self) -> None:
        """The policy's master weights are float32 (``master_weights.py``): DeepSpeed's
        ``fp16_master_weights_and_grads`` / ``bf16_master_weights_and_grads`` (ZeRO 1-3) keep
        them, and the gradients, in the half dtype, where an update below half an ulp of a
        weight rounds away."""
        for name in (DS_FP16, DS_BF16):
            section = self.cfg.get(name)
            key = f"{name}_master_weights_and_grads"
            if not isinstance(section, dict) or not deepspeed_flag(section.get(key)):
                continue
            self._conflict(
                f"{name}.{key}",
                section[key],
                f"{name}.{key}=false",
                f"it keeps master weights and gradients in {name}, where small updates round "
                f"away; the policy keeps float32 master weights",
            )
            section[key] = False

    def _param_dtype(self) -> None:
        data_types = self.cfg.get("data_types")
        if not isinstance(data_types, dict) or data_types.get("param_dtype") in (None, "auto"):
            return
        try:
            found = normalize_dtype(data_types["param_dtype"])
        except PrecisionConfigError:
            return  # not a precision this plugin governs; DeepSpeed validates it
        if found != self.policy.dtype:
            self._conflict(
                "data_types.param_dtype",
                data_types["param_dtype"],
                f"data_types.param_dtype={json.dumps(self.policy.dtype)}",
            )
            data_types["param_dtype"] = self.policy.dtype
