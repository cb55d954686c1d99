"""The named seams of asynchronous rollouts (``trl_reasoning.async_rollouts.protocols``): each generator is a
``Generator``, and each weight transport ships a job's weights once per version, whichever object carries them.

The server's transport is tested against the stand-in vLLM server in ``test_async_server.py``."""

from __future__ import annotations

import inspect
import queue

import pytest
import torch

from trl_reasoning.async_rollouts import process_generator
from trl_reasoning.async_rollouts.behaviour import ModelSwap, trainable_parameters
from trl_reasoning.async_rollouts.inline_generator import InProcessGenerator
from trl_reasoning.async_rollouts.process_generator import GeneratorProcess, SharedMemoryTransport, WorkerJob
from trl_reasoning.async_rollouts.protocols import (
    GenerationJob,
    Generator,
    VersionedWeights,
    WeightTransport,
    protocol_members,
)
from trl_reasoning.async_rollouts.server_generator import ServerGenerator, ServerWeightSync


def _weights(value: float) -> dict[str, torch.Tensor]:
    return {"w": torch.full((2, 3), value), "b": torch.full((3,), value)}


def _counting_packs(monkeypatch) -> list[dict]:
    """Every weights dict :func:`process_generator.packed` is asked to pack."""
    packs: list[dict] = []
    pack = process_generator.packed

    def counted(weights):
        packs.append(weights)
        return pack(weights)

    monkeypatch.setattr(process_generator, "packed", counted)
    return packs


def test_every_generator_and_transport_is_its_protocol():
    in_process = InProcessGenerator(lambda job: ([], []), ModelSwap(dict, lambda: None))
    assert isinstance(in_process, Generator) and isinstance(in_process.transport, WeightTransport)
    assert isinstance(SharedMemoryTransport(), WeightTransport)
    assert isinstance(ServerWeightSync(lambda weights: None, lambda: None), WeightTransport)
    # the two that need a worker or a server: every member is the class's or set by its __init__
    for generator_class in (GeneratorProcess, ServerGenerator):
        init = inspect.getsource(generator_class.__init__)
        missing = [
            name
            for name in protocol_members(Generator)
            if not hasattr(generator_class, name) and f"self.{name}" not in init
        ]
        assert not missing, f"{generator_class.__name__} lacks {missing}"


def test_shared_memory_packs_once_per_version(monkeypatch):
    packs = _counting_packs(monkeypatch)
    transport = SharedMemoryTransport()
    first = _weights(1.0)
    with transport.holding(VersionedWeights(0, first)) as block:
        assert [float(flat[0]) for flat in block["flat"]] == [1.0]
    # the same version in another dict (a converted copy): the same block, nothing packed
    with transport.holding(VersionedWeights(0, {name: t.clone() for name, t in first.items()})) as again:
        assert again is block
    assert len(packs) == 1 and transport.held_version == 0
    with transport.holding(VersionedWeights(1, _weights(2.0))) as newer:
        assert newer is not block and [float(flat[0]) for flat in newer["flat"]] == [2.0]
    with transport.holding(VersionedWeights(1, _weights(2.0))):
        pass
    assert len(packs) == 2 and transport.held_version == 1
    transport.forget()
    with transport.holding(VersionedWeights(1, _weights(2.0))):
        pass
    assert len(packs) == 3, "a forgotten version is shipped again"


def test_the_process_generator_queues_its_jobs_with_one_block_per_version(monkeypatch):
    """What crosses to the worker is a ``WorkerJob`` with the shared block; the submitted ``GenerationJob`` keeps its
    ``VersionedWeights`` (the field never changes type in flight)."""
    packs = _counting_packs(monkeypatch)
    generator = object.__new__(GeneratorProcess)  # no worker: its queue is read here
    generator._jobs, generator.submitted, generator.transport = queue.Queue(), set(), SharedMemoryTransport()
    weights = VersionedWeights(3, _weights(1.0))
    jobs = [GenerationJob(step, [[1, 2]], weights, seed=step) for step in range(2)]
    jobs.append(GenerationJob(2, [[1, 2]], VersionedWeights(3, dict(weights.tensors)), seed=2))
    jobs.append(GenerationJob(3, [[1, 2]], VersionedWeights(4, _weights(2.0)), seed=3))
    for job in jobs:
        generator.submit(job)
    generator.submit(jobs[0])  # a step already submitted is not sent again
    queued = [generator._jobs.get_nowait() for _ in range(generator._jobs.qsize())]
    assert all(isinstance(job, WorkerJob) for job in queued) and [job.step for job in queued] == [0, 1, 2, 3]
    assert queued[0].packed_weights is queued[1].packed_weights is queued[2].packed_weights
    assert queued[3].packed_weights is not queued[0].packed_weights
    assert len(packs) == 2
    assert all(isinstance(job.weights, VersionedWeights) for job in jobs)


def test_model_swap_swaps_in_other_versions_only_and_restores_the_model():
    model = torch.nn.Linear(3, 2)
    own = {name: p.detach().clone() for name, p in model.named_parameters()}
    version_now = 5
    swap = ModelSwap(lambda: trainable_parameters(model), lambda: version_now)
    older = {name: torch.full_like(t, 7.0) for name, t in own.items()}
    with swap.holding(VersionedWeights(4, older)):
        assert all(torch.equal(p, older[name]) for name, p in model.named_parameters())
    assert all(torch.equal(p, own[name]) for name, p in model.named_parameters())
    # the model's own version: nothing is copied in, even from a dict of other values (they would be the same)
    with swap.holding(VersionedWeights(5, older)):
        assert all(torch.equal(p, own[name]) for name, p in model.named_parameters())
    assert swap.held_version == 5


def test_the_in_process_generator_samples_with_the_jobs_weights():
    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    seen = []

    def sample(job):
        seen.append(float(model.weight.detach().sum()))
        return [[1]], [[-0.5]]

    generator = InProcessGenerator(sample, ModelSwap(lambda: trainable_parameters(model), lambda: 1))
    generator.submit(GenerationJob(0, [[1]], VersionedWeights(0, {"weight": torch.full((1, 2), 3.0)}), seed=0))
    generator.submit(GenerationJob(1, [[1]], VersionedWeights(1, {"weight": torch.full((1, 2), 9.0)}), seed=0))
    assert seen == [6.0, 2.0]  # version 0 swapped in; version 1 is what the model holds
    assert float(model.weight.detach().sum()) == 2.0
    assert generator.result(0)[:2] == ([[1]], [[-0.5]])


@pytest.mark.parametrize("version_first", [0, 1])
def test_the_server_sync_pushes_once_per_version(version_first):
    pushed, released = [], []
    transport = ServerWeightSync(lambda weights: pushed.append(weights.version), lambda: released.append(True))
    first = _weights(1.0)
    for tensors in (first, {name: t.to(torch.float64) for name, t in first.items()}, first):
        with transport.holding(VersionedWeights(version_first, tensors)):
            pass
    assert pushed == [version_first] and len(released) == 1
    with transport.holding(VersionedWeights(version_first + 1, first)):
        pass
    assert pushed == [version_first, version_first + 1] and len(released) == 2


def test_a_push_that_fails_leaves_the_servers_version_unknown():
    def failing(weights):
        raise ConnectionError("down")

    transport = ServerWeightSync(failing, lambda: None)
    with pytest.raises(ConnectionError), transport.holding(VersionedWeights(0, _weights(1.0))):
        pass
    assert transport.held_version is None
