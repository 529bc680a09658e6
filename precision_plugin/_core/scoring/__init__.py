"""Framework-neutral scoring: per-token log-probs of given token sequences, and what compares them.

- [`Scorer`][precision_plugin._core.scoring.Scorer]: the interface every engine implements (score
  these token sequences, return each completion token's log-prob);
- [`HFScorer`][precision_plugin._core.scoring.HFScorer]: the HF implementation (one prefill forward
or
  an incremental KV-cache decode, alone or in left-padded batches, under autocast or not);
- [`bitwise_equal`][precision_plugin._core.scoring.bitwise_equal]: the share of tokens whose
log-probs
  are equal bit for bit;
- [`batch_rescore`][precision_plugin._core.scoring.batch_rescore]: every sequence scored alone and
  inside a batch of N, compared bit for bit (the batch-invariance check).

The probe's attribution and the drift canary both build on these; nothing here imports a tool.
"""

from __future__ import annotations

from precision_plugin._core.scoring.bitwise import BitwiseEqual, bitwise_equal
from precision_plugin._core.scoring.hf import CHUNK_LOGITS, HFScorer, trainer_precision
from precision_plugin._core.scoring.interface import Scorer, TokenSequence, sequences_of
from precision_plugin._core.scoring.rescore import BatchRescore, batch_rescore

__all__ = [
    "CHUNK_LOGITS",
    "BatchRescore",
    "BitwiseEqual",
    "HFScorer",
    "Scorer",
    "TokenSequence",
    "batch_rescore",
    "bitwise_equal",
    "sequences_of",
    "trainer_precision",
]
