"""The metrics of the train/rollout mismatch, as one package (layer 2, pure torch, float64):

- [`mismatch`][precision_plugin.metrics.mismatch]: per-token metrics (k1/k3 KL, probability
  differences), the drift fit, the sums that add up across processes, and the alias catalogue
  (``ALIASES``, data) to the names other systems log;
- [`consequence`][precision_plugin.metrics.consequence]: what the mismatch does to a policy
  gradient (effective sample size, sequence masks, TIS clipping, growth with length).

``precision_plugin.mismatch`` and ``precision_plugin.consequence`` remain their public paths.
"""

#: The public names live in the two modules (documented there); the package adds none.
__all__: list[str] = []
