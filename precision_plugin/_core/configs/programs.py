"""The dialect of each program whose configuration the plugin reads (data, with the source lines).

Versions read: OpenRLHF 0.11.2 (``openrlhf/cli/train_ppo_ray.py``), SGLang 0.5.23
(``sglang/srt/arg_groups/fields/*.py``, ``server_args_config_parser.py``), slime ``624b824a``
(``slime/utils/arguments.py``, ``slime/backends/megatron_utils/arguments.py``), Megatron-LM
``d98e8a64`` (:mod:`precision_plugin._core.configs.megatron`), verl 0.9 (``trainer/config/*.yaml``),
AReaL 1.0.4 (``areal/api/cli_args.py``), TRL 1.16 (``trl/trainer/grpo_config.py``). The
contract tests (``tests/contract_openrlhf``, ``tests/contract_sglang``, ``tests/contract_verl``)
compare each with the installed program's own parser.
"""

from __future__ import annotations

from precision_plugin._core.configs.megatron import MEGATRON_PAIRS
from precision_plugin._core.configs.reader import Dialect, Key

OPENRLHF = Dialect(
    program="OpenRLHF",
    style="argparse",
    version="0.11.2",
    keys=(
        Key("ds.param_dtype", "choice", ("bf16", "fp16"), cite="train_ppo_ray.py:331-336"),
        Key("ds.tensor_parallel_size", "int", cite="train_ppo_ray.py (type=int)"),
        Key("ds.load_in_4bit", "switch", cite="train_ppo_ray.py (store_true)"),
        Key("vllm.num_engines", "int", cite="train_ppo_ray.py (type=int, default None)"),
        Key("vllm.tensor_parallel_size", "int"),
        Key("actor.model_name_or_path", "text"),
        Key("algo.advantage.is_correction_enable", "switch", cite="0.10.2 - 0.11.1 (store_true)"),
        Key(
            "algo.advantage.is_correction_level",
            "choice",
            ("off", "token", "seq"),
            cite="train_ppo_ray.py 0.11.2 (choices)",
        ),
    ),
    neighbours=frozenset(
        {
            "ds.grad_accum_dtype",
            "vllm.gpu_memory_utilization",
            "algo.advantage.is_correction_mode",
            "algo.advantage.is_correction_type",
            "algo.advantage.is_correction_gating",
            "algo.advantage.is_correction_threshold",
            "--ds.grad_accum_dtype",
            "--algo.advantage.is_correction_mode",
            "--algo.advantage.is_correction_type",
            "--algo.advantage.is_correction_gating",
            "--algo.advantage.is_correction_threshold",
            "--vllm.enable_sleep",
        }
    ),
)

_SGLANG_KEYS = (
    Key("model_path", "text", flag="--model-path"),
    # A dtype is read by the one dtype normalisation (frameworks.sglang_runs): the keyword
    # arguments also take a torch.dtype.
    Key("dtype", "dtype", cite="fields/model.py (choices)"),
    Key("kv_cache_dtype", "text", flag="--kv-cache-dtype"),
    Key("enable_deterministic_inference", "switch", flag="--enable-deterministic-inference"),
    Key("enable_fp32_lm_head", "switch", flag="--enable-fp32-lm-head"),
    Key("speculative_eagle_topk", "int", flag="--speculative-eagle-topk"),
    Key("attention_backend", "text", flag="--attention-backend"),
    Key("rl_on_policy_target", "text", flag="--rl-on-policy-target"),
)

SGLANG = Dialect(
    program="SGLang",
    style="argparse",
    version="0.5.23",
    keys=_SGLANG_KEYS,
    neighbours=frozenset(
        {
            "--prefill-attention-backend",
            "--decode-attention-backend",
            "--mm-attention-backend",
            "--speculative-eagle-topk",
            "--enable-fp32-lm-head",
            "--enable-dp-lm-head",  # a real flag (tests/contract_sglang/test_reader_contract.py)
            "enable_dp_lm_head",
            "--tokenizer-path",
            "prefill_attention_backend",
            "decode_attention_backend",
            "mm_attention_backend",
            "tokenizer_path",
        }
    ),
)

#: slime: Megatron's --fp16/--bf16 and SGLang's flags with the --sglang- prefix.
SLIME = Dialect(
    program="slime",
    style="argparse",
    version="624b824a",
    keys=(
        Key("fp16", "switch", flag="--fp16"),
        Key("bf16", "switch", flag="--bf16"),
        Key("hf_checkpoint", "text", flag="--hf-checkpoint"),
        Key("sglang_config", "text", flag="--sglang-config"),
        *(
            Key(f"sglang_{k.path}", k.kind, k.choices, flag="--sglang-" + k.path.replace("_", "-"))
            for k in _SGLANG_KEYS
            if k.path != "model_path"
        ),
    ),
    pairs=MEGATRON_PAIRS,
    neighbours=frozenset(
        {"--sglang-server-concurrency", "--sglang-router-ip", "--sglang-router-port"}
    ),
)

#: Megatron-LM's own command line (pretrain_gpt.py and the like): the same pair, refused.
MEGATRON = Dialect(
    program="Megatron-LM",
    style="argparse",
    version="d98e8a64",
    keys=(Key("fp16", "switch", flag="--fp16"), Key("bf16", "switch", flag="--bf16")),
    pairs=MEGATRON_PAIRS,
)

VERL = Dialect(
    program="verl",
    style="omegaconf",
    version="0.9",
    keys=(
        Key("actor_rollout_ref.rollout.dtype", "text"),
        Key("actor_rollout_ref.rollout.name", "text"),
        Key("actor_rollout_ref.rollout.calculate_log_probs", "switch"),
        Key("actor_rollout_ref.rollout.tensor_model_parallel_size", "int"),
        Key("actor_rollout_ref.actor.strategy", "text"),
        Key("actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype", "text"),
        Key("actor_rollout_ref.actor.fsdp_config.dtype", "text"),
        Key("actor_rollout_ref.actor.megatron.dtype", "text"),
        Key("actor_rollout_ref.model.path", "text"),
        Key("actor_rollout_ref.model.lora_rank", "int"),
        Key("critic.enable", "switch"),
        Key("algorithm.use_kl_in_reward", "switch"),
        Key("algorithm.rollout_correction.rollout_is", "text"),
    ),
    neighbours=frozenset(
        {
            "actor_rollout_ref.rollout.mode",
            "actor_rollout_ref.ref.strategy",
            "actor_rollout_ref.rollout.data_parallel_size",
            "actor_rollout_ref.rollout.pipeline_model_parallel_size",
            "actor_rollout_ref.rollout.expert_parallel_size",
            "actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype",
            "actor_rollout_ref.ref.fsdp_config.dtype",
            "actor_rollout_ref.ref.megatron.dtype",
            "actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype",
            "actor_rollout_ref.actor.fsdp_config.mixed_precision.buffer_dtype",
            "actor_rollout_ref.model.lora_alpha",
            "actor_rollout_ref.model.lora_adapter_path",
            "actor_rollout_ref.rollout.load_format",
            "algorithm.rollout_correction.rollout_rs",
            "algorithm.use_kl_loss",
            "critic.model.path",
            "critic.strategy",
        }
    ),
)

#: AReaL: dataclasses merged by OmegaConf; a dtype is a torch attribute name.
AREAL = Dialect(
    program="AReaL",
    style="structured",
    version="1.0.4",
    keys=(
        Key("actor.dtype", "text"),
        Key("ref.dtype", "text"),
        Key("critic.dtype", "text"),
        Key("actor.backend", "text"),
        Key("actor.path", "text"),
        Key("sglang.dtype", "text"),
        Key("sglang.kv_cache_dtype", "text"),
        Key("sglang.enable_deterministic_inference", "switch"),
        Key("sglang.enable_fp32_lm_head", "switch"),
        Key("rollout.backend", "text"),
    ),
    neighbours=frozenset({"ref.backend", "critic.backend", "ref.path", "critic.path"}),
)

TRL = Dialect(
    program="TRL",
    style="python",
    version="1.16",
    keys=(
        Key("max_completion_length", "int", cite="grpo_config.py (int, default 256)"),
        Key("temperature", "float"),
        Key("top_p", "float"),
        Key("top_k", "int"),
        Key("min_p", "float"),
        Key("repetition_penalty", "float"),
        Key("generation_kwargs", "mapping", cite="grpo_config.py (dict | None; JSON on the CLI)"),
        Key("fp16", "switch"),
        Key("bf16", "switch"),
        Key("use_vllm", "switch"),
        Key("vllm_mode", "choice", ("server", "colocate")),
    ),
    neighbours=frozenset(
        {"max_prompt_length", "max_length", "top_entropy_quantile", "vllm_model_impl", "tf32"}
    ),
)

#: Every dialect, by program (for the adversarial property tests and the docs).
DIALECTS: dict[str, Dialect] = {
    d.program: d for d in (OPENRLHF, SGLANG, SLIME, MEGATRON, VERL, AREAL, TRL)
}
