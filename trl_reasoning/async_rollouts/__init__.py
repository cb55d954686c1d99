"""Floor 3, asynchronous rollouts: the pipeline that keeps generation k steps ahead of training with the behaviour
policy's weights, and the generators it drives (in-process, a separate process, TRL's vLLM server).
Imports the algorithms and utilities, never the trainer: what it needs from the trainer is named in its protocols.

``trl_reasoning.async_rollouts`` was one module before 0.2; its names are still importable from here.
"""

from .pipeline import (
    ASYNC_STATE_FORMAT,
    BEHAVIOUR_WEIGHTS_FILE,
    AheadPipeline,
    AsyncRollouts,
    BehaviourWeights,
    async_rollouts_for,
    job_seed,
)

__all__ = [
    "ASYNC_STATE_FORMAT",
    "BEHAVIOUR_WEIGHTS_FILE",
    "AheadPipeline",
    "AsyncRollouts",
    "BehaviourWeights",
    "async_rollouts_for",
    "job_seed",
]
