"""Layer 2, the core (internal): the policy machinery, the numerics (metrics, intervals,
scoring, the canary) and the learner-side helpers every adapter shares. Imports only layer 1
and the public face (errors, policy, hookspecs)."""
