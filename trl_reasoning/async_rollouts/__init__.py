"""Floor 3, asynchronous rollouts: the pipeline that keeps generation k steps ahead of training with the behaviour
policy's weights, and the generators it drives (in-process, a separate process, TRL's vLLM server).
Imports the algorithms and utilities, never the trainer: what it needs from the trainer, what a generator is and how
weights travel to it are named in ``protocols`` (``AsyncRolloutHost``, ``Generator``, ``WeightTransport``).

The package exports the facade (``AsyncRollouts``, ``async_rollouts_for``), the ahead pipeline (``AheadPipeline``,
``job_seed``), the behaviour weights and the protocols with the types they pass.

The generators are declared in ``trl_reasoning.async_generators`` (name, help, run shape, refusals); each one's start
function is registered by name (``starts.register_generator``) when its module is imported, which happens here, on
the package's import: a new generator module is added to the line below.
"""

from . import inline_generator, process_generator, server_generator  # noqa: F401  (each registers its generator)
from .ahead import AheadPipeline, job_seed
from .behaviour import ASYNC_STATE_FORMAT, BEHAVIOUR_WEIGHTS_FILE, BehaviourWeights
from .pipeline import AsyncRollouts, async_rollouts_for
from .protocols import (
    AsyncRolloutHost,
    GenerateBackendHost,
    GenerationJob,
    Generator,
    VersionedWeights,
    VLLMBackendHost,
    WeightTransport,
)

__all__ = [
    "ASYNC_STATE_FORMAT",
    "BEHAVIOUR_WEIGHTS_FILE",
    "AheadPipeline",
    "AsyncRolloutHost",
    "AsyncRollouts",
    "BehaviourWeights",
    "GenerateBackendHost",
    "GenerationJob",
    "Generator",
    "VLLMBackendHost",
    "VersionedWeights",
    "WeightTransport",
    "async_rollouts_for",
    "job_seed",
]
