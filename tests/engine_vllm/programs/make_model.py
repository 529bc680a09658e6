"""Save the probe's embedded Llama with tied embeddings (``make_model.py PATH``)."""

import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from precision_plugin.probe.tiny_model import DEFAULT_CONFIG, LOGIT_SCALE, build_tokenizer


def main(path: str) -> None:
    tokenizer = build_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **{**DEFAULT_CONFIG, "tie_word_embeddings": True},
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # a peaked next-token distribution, as the embedded model has
        model.model.embed_tokens.weight.mul_(LOGIT_SCALE)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)


if __name__ == "__main__":
    main(sys.argv[1])
