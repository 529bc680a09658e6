"""The metrics of the train/rollout mismatch, as one package (layer 2, pure torch, float64):

- [`mismatch`][precision_plugin._core.metrics.mismatch]: per-token metrics (k1/k3 KL, probability
  differences) of one batch and their verdict; the public path of every name below;
- ``aliases``: the alias catalogue (``ALIASES``, data) to the names other systems log;
- ``inputs``: coercion and validators of log-probs, masks and per-sequence pairs, which
  ``mismatch``, ``drift``, ``shard_sums`` and ``consequence`` share;
- ``drift``: the one drift fit (the random walk of sequence log-ratios against length);
- ``shard_sums``: the sums that add up across processes and the metrics from their totals;
- [`consequence`][precision_plugin._core.metrics.consequence]: what the mismatch does to a policy
  gradient (effective sample size, sequence masks, TIS clipping, growth with length).

``precision_plugin._core.metrics.mismatch`` and ``precision_plugin._core.metrics.consequence``
remain their public paths.
"""

#: The public names live in the two modules (documented there); the package adds none.
__all__: list[str] = []
