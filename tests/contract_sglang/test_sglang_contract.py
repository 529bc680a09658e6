"""The plugin against real SGLang 0.5.23 on CPU: its parser, its resolution, its plugin loader,
the payload of its /server_info, and AReaL's and slime's ways of building its arguments."""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from conftest import LLAMA, cpu_argv, run_installed, write_checkpoint
from sglang.srt.configs.model_config import ModelConfig, is_deepseek_dsa
from sglang.srt.sampling.watermarking.core import redact_watermark_secrets
from sglang.srt.server_args import ServerArgs, prepare_server_args
from sglang.srt.utils.common import build_server_info
from sglang.srt.utils.msgspec_utils import msgspec_to_builtins
from sglang.version import __version__ as SGLANG_VERSION

from precision_plugin import PrecisionPolicy
from precision_plugin._core.frameworks import SGLANG_DTYPE_CHOICES
from precision_plugin.errors import PrecisionConfigError, PrecisionMismatchError
from precision_plugin.probe.attribution.fixes import CAUSE_TABLE
from precision_plugin.sglang import (
    auto_dtype,
    check_server_args,
    read_server_args,
    server_args,
    verify_server,
)
from precision_plugin.sglang.args import FIELDS, field_parser
from precision_plugin.sglang.checkpoint import BF16_ARCHITECTURES, DSA_ARCHITECTURES
from precision_plugin.sglang.plugin import (
    ENTRY_POINT_GROUP,
    MODEL_CONFIG_TARGET,
    resolve_target,
)
from tests.loopback import Answer, loopback

STRICT_POLICY = PrecisionPolicy(strictness="error")


def sglang_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return parser


def resolved(argv: list[str]) -> ServerArgs:
    record = prepare_server_args(argv)
    record.resolve_once()
    return record


def runs(record: ServerArgs) -> str:
    """The dtype SGLang builds the model in, from its own ModelConfig."""
    return str(ModelConfig.from_server_args(record).dtype).removeprefix("torch.")


# -- argument parsing ---------------------------------------------------------------------------
def test_dtype_choices_are_sglangs_and_fp16_is_refused():
    action = next(a for a in sglang_parser()._actions if a.dest == "dtype")
    assert list(action.choices) == list(SGLANG_DTYPE_CHOICES)
    with pytest.raises(SystemExit):
        sglang_parser().parse_args(["--model-path", "m", "--dtype", "fp16"])
    kv = next(a for a in sglang_parser()._actions if a.dest == "kv_cache_dtype")
    assert "float16" not in kv.choices and "auto" in kv.choices  # no float16 KV choice: auto


def test_fields_and_defaults_match_server_args():
    defaults = {f.name: f.default for f in msgspec.structs.fields(ServerArgs)}
    assert defaults["model_path"] is msgspec.NODEFAULT  # required: no default to read
    optional = {name: value for name, value in FIELDS.items() if name != "model_path"}
    assert {name: defaults[name] for name in optional} == optional


def test_our_flags_are_sglangs_flags():
    """Every flag field_parser reads is one SGLang's parser defines, with the same dest."""
    ours = {opt: a.dest for a in field_parser()._actions for opt in a.option_strings}
    theirs = {opt: a.dest for a in sglang_parser()._actions for opt in a.option_strings}
    assert {opt: theirs.get(opt) for opt in ours} == ours


def test_fixes_table_sglang_flags_are_sglangs():
    """The attribution's SGLang fixes (CAUSE_TABLE) are copied into users' launches: every flag is
    one SGLang's parser defines, with a value among its choices (a misspelt flag passed every test
    before). The value is the word after the flag, read only where the flag takes one."""
    found = {
        (m[1], m[2])
        for cause in CAUSE_TABLE.values()
        for m in re.finditer(r"(--[a-z0-9][a-z0-9-]*)(?: ([\w.]+))?", cause.fixes.get("SGLang", ""))
    }
    actions = {opt: a for a in sglang_parser()._actions for opt in a.option_strings}
    assert sorted(flag for flag, _ in found if flag not in actions) == []
    assert {flag for flag, _ in found} == {
        "--dtype",
        "--enable-deterministic-inference",
        "--enable-fp32-lm-head",
        "--kv-cache-dtype",
        "--rl-on-policy-target",
    }
    for flag, value in found:
        action = actions[flag]
        if value and action.nargs != 0 and action.choices:
            assert value in action.choices, (flag, value, action.choices)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_server_args_flags_and_kwargs_parse_to_the_policy(llama_dir, dtype):
    launch = server_args(dtype)
    record = resolved(cpu_argv(llama_dir, *launch.flags))
    assert (record.dtype, record.kv_cache_dtype) == (dtype, "auto")
    assert runs(record) == dtype
    built = ServerArgs(model_path=llama_dir, device="cpu", **launch.kwargs)
    assert (built.dtype, built.kv_cache_dtype) == (dtype, "auto")


ARGVS = [
    [],
    ["--dtype", "half", "--kv-cache-dtype", "fp8_e4m3"],
    ["--rl-on-policy-target", "fsdp", "--enable-deterministic-inference"],
    ["--attention-backend", "hpc_ops", "--moe-runner-backend", "triton", "--enable-fp32-lm-head"],
    ["--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "4", "--dtype=bfloat16"],
]


@pytest.mark.parametrize("extra", ARGVS, ids=lambda a: " ".join(a) or "defaults")
def test_read_server_args_reads_argv_as_sglang_does(llama_dir, extra):
    argv = ["--model", llama_dir, *extra]
    record = prepare_server_args(argv)
    want = {name: getattr(record, name) for name in FIELDS}
    assert read_server_args(argv) == want
    assert read_server_args(record) == want
    assert read_server_args({k: v for k, v in want.items()}) == want


def test_config_file_under_the_command_line(llama_dir, tmp_path):
    config = tmp_path / "sglang.yaml"
    config.write_text(
        "dtype: bfloat16\nkv-cache-dtype: fp8_e5m2\nrl-on-policy-target: fsdp\n"
        "enable-fp32-lm-head: true\nenable-deterministic-inference: false\n"
    )
    argv = ["--model-path", llama_dir, "--config", str(config), "--dtype", "float16"]
    record = prepare_server_args(list(argv))
    want = {name: getattr(record, name) for name in FIELDS}
    assert want["dtype"] == "float16" and want["kv_cache_dtype"] == "fp8_e5m2"
    assert want["rl_on_policy_target"] == "fsdp" and want["enable_fp32_lm_head"] is True
    assert read_server_args(argv) == want


# -- the dtype from resolve_once ------------------------------------------------------------------
GEMMA = {**LLAMA, "architectures": ["GemmaForCausalLM"], "model_type": "gemma", "head_dim": 16}
NO_DTYPE = {k: v for k, v in LLAMA.items() if k != "torch_dtype"}
CHECKPOINTS = {
    "llama bf16": LLAMA,
    "llama fp16": {**LLAMA, "torch_dtype": "float16"},
    "llama fp32": {**LLAMA, "torch_dtype": "float32"},
    "llama undeclared": NO_DTYPE,
    "llama dtype key": {**NO_DTYPE, "dtype": "float16"},
    "gemma fp32": {**GEMMA, "torch_dtype": "float32"},
    "gemma bf16": {**GEMMA, "torch_dtype": "bfloat16"},
}


@pytest.mark.parametrize("name", list(CHECKPOINTS))
def test_auto_dtype_is_what_resolve_once_runs(tmp_path, name):
    config = CHECKPOINTS[name]
    record = resolved(cpu_argv(write_checkpoint(tmp_path / "ck", config)))
    assert record.resolved_dict()["dtype"] == "auto"  # what /server_info reports
    assert auto_dtype(config) == runs(record)


def test_the_bf16_and_dsa_tables_are_sglangs():
    from sglang.srt.arg_groups.model_override_base import MODEL_OVERRIDES

    forced = {a for a, v in MODEL_OVERRIDES.items() if v.get("dtype") == "bfloat16"}
    assert forced == BF16_ARCHITECTURES
    for arch in DSA_ARCHITECTURES:
        assert is_deepseek_dsa({"architectures": [arch], "index_topk": 2048})
        assert not is_deepseek_dsa({"architectures": [arch]})


def test_check_server_args_on_resolved_records(llama_dir):
    auto = resolved(cpu_argv(llama_dir))  # a bf16 checkpoint under dtype auto
    with pytest.raises(PrecisionMismatchError, match=r"runs bfloat16 \(dtype=auto"):
        check_server_args(auto, STRICT_POLICY)
    assert [f.status for f in check_server_args(auto, "bfloat16")] == ["ok"]
    forced = resolved(cpu_argv(llama_dir, *server_args().flags))
    assert [f.status for f in check_server_args(forced, STRICT_POLICY)] == ["ok"]


# -- the entry point: force where SGLang resolves, verify elsewhere -------------------------------
PROBE = """
import json, logging, os, sys
import precision_plugin
from sglang.srt.plugins import load_plugins
from sglang.srt.server_args import prepare_server_args
from sglang.srt.configs.model_config import ModelConfig
print("FILE", precision_plugin.__file__)
warnings = []
handler = logging.Handler()
handler.emit = lambda r: warnings.append(r.getMessage()) if r.levelno >= logging.WARNING else None
logging.getLogger("precision_plugin").addHandler(handler)
load_plugins()  # what sglang serve / launch_server / Engine.__init__ do first
for name, env, argv in json.loads(sys.argv[1]):
    os.environ.pop("SGLANG_SANITIZE_NAN_LOGITS", None)
    os.environ.update(env)  # the hooks read the policy when they run
    warnings.clear()
    record = prepare_server_args(argv)
    try:
        record.resolve_once()
    except Exception as exc:
        print(name + ".REFUSED", type(exc).__name__, str(exc).replace(chr(10), " "))
        continue
    print(name + ".RECORD", record.dtype)
    print(name + ".RESOLVED", record.resolved_dict()["dtype"])
    print(name + ".RUNS", str(ModelConfig.from_server_args(record).dtype))
    print(name + ".WARNED", " | ".join(warnings).replace(chr(10), " ") or "-")
"""
STRICT_ENV = json.dumps({"dtype": "float16", "strictness": "error"})
WARN = {"PRECISION_PLUGIN": "float16"}
STRICT_RUN = {"PRECISION_PLUGIN": STRICT_ENV}
ROOT = Path(__file__).resolve().parents[2]


def recipe_args() -> list[str]:
    """The arguments integrations/sglang/serve.sh passes to ``sglang serve`` (``$MODEL`` kept)."""
    text = (ROOT / "integrations" / "sglang" / "serve.sh").read_text().replace("\\\n", " ")
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("exec sglang serve"))
    args = [a for a in shlex.split(line)[3:] if a != "$@"]
    return [a.replace("$PORT", "30000") for a in args]


#: (case, environment, extra arguments) run one after another in one SGLang process.
CASES = [
    ("recipe", {"PRECISION_PLUGIN": "float16"}, recipe_args()),
    ("auto", WARN, []),
    ("bf16", WARN, ["--dtype", "bfloat16"]),
    ("strict_bf16", STRICT_RUN, ["--dtype", "bfloat16"]),
    ("strict_rl", STRICT_RUN, ["--rl-on-policy-target", "fsdp"]),
    ("strict_kv", STRICT_RUN, ["--kv-cache-dtype", "bf16"]),
    ("strict_nan", {**STRICT_RUN, "SGLANG_SANITIZE_NAN_LOGITS": "1"}, []),
    ("strict_ok", STRICT_RUN, []),
]


def probe(tmp_path, model, cases, **env):
    """Run ``cases`` through SGLang's parser and resolution in one fresh process whose plugins
    were loaded under ``env``; ``{case.KEY: value}``."""
    spec = [
        (name, case_env, [a.replace("$MODEL", model) for a in cpu_argv(model, *extra)])
        for name, case_env, extra in cases
    ]
    code = PROBE + "\n"
    return run_installed(
        f"import sys; sys.argv[1:] = [{json.dumps(spec)!r}]\n" + code, tmp_path, **env
    )


@pytest.fixture(scope="module")
def hooked(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hooked")
    model = str(write_checkpoint(tmp / "llama", LLAMA))
    return probe(tmp, model, CASES, PRECISION_PLUGIN="float16")


def test_entry_point_is_registered_and_targets_exist():
    from importlib.metadata import entry_points

    names = {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}
    assert names["precision_plugin"] == "precision_plugin.sglang:general_plugin"
    assert resolve_target(ServerArgs) == "sglang.srt.server_args.ServerArgs.resolve_once"
    assert isinstance(ModelConfig.__dict__["from_server_args"], staticmethod)
    assert MODEL_CONFIG_TARGET.endswith("ModelConfig.from_server_args")


@pytest.mark.parametrize("case", ["recipe", "auto", "bf16", "strict_ok"])
def test_the_hook_forces_the_policy_dtype(hooked, case):
    got = tuple(hooked[f"{case}.{key}"] for key in ("RECORD", "RESOLVED", "RUNS"))
    assert got == ("float16", "float16", "torch.float16")  # the checkpoint is bf16
    warned = "contradicts the policy dtype float16" in hooked[f"{case}.WARNED"]
    assert warned == (case == "bf16")


@pytest.mark.parametrize(
    ("case", "why"),
    [
        ("strict_bf16", "--dtype bfloat16, which contradicts the policy dtype float16"),
        ("strict_rl", "--rl-on-policy-target fsdp"),
        ("strict_kv", "KV cache in bfloat16"),
        ("strict_nan", "SGLANG_SANITIZE_NAN_LOGITS=1"),
    ],
)
def test_the_hook_refuses_under_strict_mode(hooked, case, why):
    refused = hooked[f"{case}.REFUSED"]
    assert refused.startswith("PrecisionMismatchError") and why in refused


def test_without_the_env_var_nothing_changes(llama_dir, tmp_path):
    case = [("plain", {}, ["--dtype", "bfloat16"])]
    out = probe(tmp_path, llama_dir, case)
    assert (out["plain.RECORD"], out["plain.RUNS"]) == ("bfloat16", "torch.bfloat16")
    skipped = probe(tmp_path, llama_dir, case, SGLANG_PLUGINS="someone_else", **WARN)
    assert skipped["plain.RUNS"] == "torch.bfloat16"  # SGLang's allow-list skips the plugin


def test_a_malformed_env_var_stops_the_launch(llama_dir, tmp_path):
    out = probe(tmp_path, llama_dir, [("bad", {}, [])], PRECISION_PLUGIN="fp12")
    assert out["bad.REFUSED"].startswith("PrecisionConfigError") and "fp12" in out["bad.REFUSED"]


SCHEDULER = """
import logging, os, pickle, sys
import precision_plugin
print("FILE", precision_plugin.__file__)
from sglang.srt.plugins import load_plugins
from sglang.srt.configs.model_config import ModelConfig
warnings = []
handler = logging.Handler()
handler.emit = lambda r: warnings.append(r.getMessage()) if r.levelno >= logging.WARNING else None
logging.getLogger("precision_plugin").addHandler(handler)
record = pickle.loads(sys.stdin.buffer.read())  # as spawn hands it to run_scheduler_process
load_plugins()  # run_scheduler_process's first line
for name, policy in [("strict", %r), ("warn", "float16"), ("agree", "bfloat16")]:
    os.environ["PRECISION_PLUGIN"] = policy
    warnings.clear()
    try:
        print(name + ".RUNS", ModelConfig.from_server_args(record).dtype)  # Scheduler.__init__
    except Exception as exc:
        print(name + ".REFUSED", type(exc).__name__, str(exc).replace(chr(10), " "))
    print(name + ".WARNED", " | ".join(warnings) or "-")
"""


def _in_a_scheduler(script: str, record: Any, tmp_path: Path, policy: str) -> dict[str, str]:
    """Run ``script`` in a fresh process (as SGLang's scheduler is), the pickled ``record`` on
    its stdin and ``PRECISION_PLUGIN=policy``; its ``KEY value`` output lines as a dict."""
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    environ.update(PYTHONPATH=str(Path(__file__).parent / "stubs"), PRECISION_PLUGIN=policy)
    done = subprocess.run(
        [sys.executable, "-c", script],
        input=pickle.dumps(record),
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    return dict(line.split(" ", 1) for line in done.stdout.decode().splitlines() if " " in line)


def test_resolved_before_plugins_load_the_scheduler_verifies(llama_dir, tmp_path):
    """Engine._launch_subprocesses (verl, slime, AReaL) resolves the record before it loads
    plugins: the hook cannot set the dtype, the scheduler process refuses or warns."""

    record = ServerArgs(model_path=llama_dir, device="cpu", skip_tokenizer_init=True)
    record.dtype = "bfloat16"  # verl: ServerArgs(**args) with rollout.dtype
    record.resolve_once()  # before load_plugins, as engine.py does
    out = _in_a_scheduler(SCHEDULER % STRICT_ENV, record, tmp_path, "float16")
    assert "site-packages" in out["FILE"]
    assert out["strict.REFUSED"].startswith("PrecisionMismatchError")
    assert "runs bfloat16, but the policy is float16" in out["strict.REFUSED"]
    assert out["warn.RUNS"] == "torch.bfloat16" and "runs as resolved" in out["warn.WARNED"]
    assert (out["agree.RUNS"], out["agree.WARNED"]) == ("torch.bfloat16", "-")


TRAPS = """
import pickle, sys
import precision_plugin
print("FILE", precision_plugin.__file__)
from sglang.srt.plugins import load_plugins
from sglang.srt.configs.model_config import ModelConfig
record = pickle.loads(sys.stdin.buffer.read())
load_plugins()
try:
    print("RUNS", ModelConfig.from_server_args(record).dtype)
except Exception as exc:
    print("REFUSED", type(exc).__name__, str(exc).replace(chr(10), " "))
"""


def test_resolved_before_plugins_load_the_traps_are_verified_too(llama_dir, tmp_path):
    """slime's --sglang-rl-on-policy-target fsdp reaches a record resolved before plugins load:
    the dtype is float16, but the logits are bf16; the scheduler refuses it under strict mode."""

    record = ServerArgs(
        model_path=llama_dir,
        device="cpu",
        skip_tokenizer_init=True,
        dtype="float16",
        rl_on_policy_target="fsdp",
        attention_backend="triton",  # rl_on_policy_target needs a deterministic backend
    )
    record.resolve_once()
    out = _in_a_scheduler(TRAPS, record, tmp_path, STRICT_ENV)
    assert "site-packages" in out["FILE"]
    assert out["REFUSED"].startswith(
        "PrecisionMismatchError the SGLang launch has --rl-on-policy-target fsdp"
    )


def test_enable_reaches_an_engine_built_in_the_process(llama_dir, tmp_path):
    code = (
        "import precision_plugin\n"
        "print('FILE', precision_plugin.__file__)\n"
        "precision_plugin.enable()\n"
        "from sglang.srt.plugins import load_plugins\n"
        "from sglang.srt.server_args import ServerArgs\n"
        "load_plugins()  # Engine.__init__ does this before it builds ServerArgs(**kwargs)\n"
        f"record = ServerArgs(model_path={llama_dir!r}, device='cpu', skip_tokenizer_init=True)\n"
        "record.resolve_once()\n"
        "print('RECORD', record.dtype)\n"
    )
    assert run_installed(code, tmp_path)["RECORD"] == "float16"


# -- /server_info against a loopback server that answers like SGLang -----------------------------
def server_info(record: ServerArgs) -> bytes:
    """``GET /server_info`` as SGLang's ``entrypoints/http_server.py`` builds it from a record."""
    payload = msgspec_to_builtins(
        redact_watermark_secrets(
            {
                **build_server_info(record, {}),
                "internal_states": [{}],
                "version": SGLANG_VERSION,
                "frontend": "python",
            }
        )
    )
    return json.dumps(payload).encode()


@pytest.fixture
def sglang_server():
    with loopback(Answer("/server_info")) as answer:
        yield answer


def test_verify_server_decides_auto_from_the_checkpoint(llama_dir, sglang_server):
    sglang_server.set(server_info(resolved(cpu_argv(llama_dir))))  # auto on a bf16 checkpoint
    where = f"SGLang server at {sglang_server.url} (SGLang {SGLANG_VERSION})"
    with pytest.raises(
        PrecisionMismatchError, match=re.escape(f"{where} runs bfloat16 (dtype=auto")
    ):
        verify_server(sglang_server.url, STRICT_POLICY)
    assert [f.status for f in verify_server(sglang_server.url, "bfloat16")] == ["ok"]


def test_verify_server_reads_an_explicit_dtype_and_the_traps(llama_dir, sglang_server):
    sglang_server.set(server_info(resolved(cpu_argv(llama_dir, *server_args().flags))))
    assert [f.status for f in verify_server(sglang_server.url, STRICT_POLICY)] == ["ok"]
    # rl_on_policy_target forces deterministic inference, which needs one of its backends
    trap = ["--dtype", "float16", "--rl-on-policy-target", "fsdp", "--attention-backend", "triton"]
    sglang_server.set(server_info(resolved(cpu_argv(llama_dir, *trap))))
    with pytest.raises(PrecisionMismatchError, match="rl-on-policy-target fsdp"):
        verify_server(sglang_server.url, STRICT_POLICY)


def test_verify_server_when_the_checkpoint_is_elsewhere(tmp_path, sglang_server):
    gone = write_checkpoint(tmp_path / "gone", LLAMA)
    sglang_server.set(server_info(resolved(cpu_argv(gone))))
    (Path(gone) / "config.json").unlink()  # the server's machine has it, this one does not
    (finding,) = verify_server(sglang_server.url, STRICT_POLICY)
    assert finding.status == "warning" and "cannot be told here" in finding.message


def test_verify_server_wrong_url_and_nothing_listening(sglang_server):
    with pytest.raises(PrecisionConfigError, match="HTTP 404: it is not an SGLang server"):
        verify_server(f"{sglang_server.url}/v1")
    (finding,) = verify_server("http://127.0.0.1:9")
    assert "Is an SGLang server running at http://127.0.0.1:9?" in finding.message


# -- AReaL: its config module builds the launch; SGLang's parser reads it --------------------------
AREAL_YAML = """
experiment_name: exp
trial_name: t0
cluster:
  fileroot: {root}
actor:
  experiment_name: ${{experiment_name}}
  trial_name: ${{trial_name}}
  backend: fsdp:d1
  path: {model}
rollout:
  experiment_name: ${{experiment_name}}
  trial_name: ${{trial_name}}
  backend: sglang:d1
sglang:
  model_path: {model}
train_dataset:
  path: data.jsonl
  type: rl
  batch_size: 1
"""
RUN_SECTIONS = ("saver", "evaluator", "stats_logger", "recover")


def areal_config(tmp_path: Path, model: str, overrides: list[str]):
    from areal.api.cli_args import GRPOConfig, parse_cli_args, to_structured_cfg
    from omegaconf import OmegaConf

    path = tmp_path / "areal.yaml"
    sections = "".join(
        f"{name}:\n  experiment_name: exp\n  trial_name: t0\n  fileroot: {tmp_path}\n"
        for name in RUN_SECTIONS
    )
    path.write_text(AREAL_YAML.format(model=model, root=tmp_path) + sections)
    cfg, _ = parse_cli_args(["--config", str(path), *overrides])
    return OmegaConf.to_object(to_structured_cfg(cfg, config_cls=GRPOConfig))


def areal_launch(cfg) -> list[str]:
    """The ``launch_server`` command line AReaL runs for its SGLang server, without the module."""
    from areal.api.cli_args import SGLangConfig

    args = SGLangConfig.build_args(cfg.sglang, tp_size=1, base_gpu_id=0)
    return SGLangConfig.build_cmd_from_args(args)[3:]


def test_areal_defaults_contradict_float16(llama_dir, tmp_path):
    from precision_plugin.areal import check_areal_config

    cfg = areal_config(tmp_path, llama_dir, [])
    with pytest.raises(PrecisionMismatchError) as err:
        check_areal_config(cfg, STRICT_POLICY)
    assert "actor trains in bfloat16" in str(err.value) and "runs bfloat16" in str(err.value)
    assert prepare_server_args(areal_launch(cfg)).dtype == "bfloat16"


def test_areal_overrides_reach_sglangs_parser(llama_dir, tmp_path):
    from precision_plugin.areal import areal_overrides, check_areal_config

    cfg = areal_config(tmp_path, llama_dir, areal_overrides("float16"))
    assert (cfg.actor.dtype, cfg.sglang.dtype) == ("float16", "float16")
    findings = check_areal_config(cfg, STRICT_POLICY)
    assert [f.status for f in findings] == ["warning", "ok"]  # FSDP has no loss scaler
    argv = areal_launch(cfg)
    assert read_server_args(argv)["dtype"] == prepare_server_args(argv).dtype == "float16"
    bf16 = areal_config(tmp_path, llama_dir, areal_overrides("bfloat16"))
    assert [f.status for f in check_areal_config(bf16, "bfloat16")] == ["ok"]


# -- slime: every --sglang-* flag it re-exports, read the way it reads them ----------------------
def slime_parser() -> argparse.ArgumentParser:
    """SGLang's flags with slime's ``--sglang-`` prefix and ``sglang_`` dests, as slime's
    ``add_sglang_arguments`` wraps ``ServerArgs.add_cli_args`` (THUDM/slime
    ``backends/sglang_utils/arguments.py``; slime itself needs Megatron and is not on PyPI)."""
    parser = argparse.ArgumentParser()
    original = parser.add_argument

    def prefixed(*flags, **kwargs):
        stem = next(f for f in flags if f.startswith("--"))[2:].replace("-", "_")
        if stem in ("model_path", "config"):
            return None
        kwargs.pop("dest", None)
        return original(*[f"--sglang-{f.lstrip('-')}" for f in flags], **kwargs)

    parser.add_argument = prefixed
    ServerArgs.add_cli_args(parser)
    parser.add_argument = original
    return parser


def test_slime_flags_are_the_sglang_flags_slime_defines():
    from precision_plugin.slime import SKIPPED

    ours = {
        opt: a.dest for a in field_parser("sglang-", SKIPPED)._actions for opt in a.option_strings
    }
    theirs = {
        opt: a.dest.removeprefix("sglang_")
        for a in slime_parser()._actions
        for opt in a.option_strings
    }
    assert {opt: theirs.get(opt) for opt in ours} == ours


def test_slime_command_line(llama_dir):
    from precision_plugin.slime import check_slime_args, slime_args

    argv = ["--hf-checkpoint", llama_dir, "--sglang-dtype", "bfloat16", *slime_args("float16")]
    theirs = slime_parser().parse_known_args(argv)[0]
    assert theirs.sglang_dtype == "bfloat16"  # slime ignores it: --fp16 set dtype first
    assert [f.status for f in check_slime_args(argv, STRICT_POLICY)] == ["ok"]
    with pytest.raises(PrecisionMismatchError, match="Megatron learner trains in bfloat16"):
        check_slime_args(["--hf-checkpoint", llama_dir], STRICT_POLICY)
