"""Floor 2, the algorithms as pure tensor functions: advantage estimators, policy objectives, loss aggregation,
reward shaping, group selection, the importance-sampling correction, truncated sampling supports and chunked
log-probabilities. Each variant is a registered function (``registry.Registry``); nothing here imports a trainer,
TRL's trainers or ``trl_reasoning.trainer`` (a test holds the direction). The math, with its sources, starts at docs/algorithms.md#notation.
"""
