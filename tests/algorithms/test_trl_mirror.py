"""What the loss mirrors from TRL: the k3 KL and the loss metrics' cross-process means (one collective)."""

from __future__ import annotations

import torch

from trl_reasoning.algorithms.trl_mirror import k3_kl, masked_means_over_processes


def test_k3_kl_with_and_without_trls_bias_correction():
    generator = torch.Generator().manual_seed(0)
    logps, ref, old = (-torch.rand(2, 3, generator=generator, dtype=torch.float64) for _ in range(3))
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
    k3 = torch.exp(ref - logps) - (ref - logps) - 1
    torch.testing.assert_close(k3_kl(ref, logps), k3)
    torch.testing.assert_close(k3_kl(ref, logps, old, mask, bias_correction=True), k3 * torch.exp(logps - old))
    per_sequence = ((logps - old) * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True)
    torch.testing.assert_close(
        k3_kl(ref, logps, old, mask, bias_correction=True, sequence_level=True), k3 * torch.exp(per_sequence)
    )


def test_loss_metrics_are_reduced_in_one_collective():
    calls = []

    def reduce_sum(totals):  # two processes holding the same micro-batch
        calls.append(totals.shape)
        return 2 * totals

    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    means = masked_means_over_processes(
        {"entropy": torch.tensor([[1.0, 3.0, 100.0], [5.0, 100.0, 100.0]]), "seq": torch.tensor([[1.0], [0.0]])},
        mask,
        reduce_sum,
        per_process={"policy_loss": torch.tensor(0.25)},
    )
    assert means == {"entropy": 3.0, "seq": 0.5, "policy_loss": 0.25}
    assert calls == [torch.Size([3, 2])]


def test_a_per_sequence_metric_averages_over_the_rows_that_train():
    """GSPO's clip fractions are one value per sequence: groups that group selection dropped (``row_active`` 0) train
    nothing and must not dilute them; per-token metrics already leave them out through the mask."""
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0], [0.0, 0.0], [1.0, 0.0]])  # rows 1 and 2 dropped (mask zeroed)
    values = {
        "clip": torch.tensor([[1.0], [0.0], [0.0], [0.0]]),
        "entropy": torch.tensor([[2.0, 4.0], [9.0, 9.0]] * 2),
    }
    active = torch.tensor([1.0, 0.0, 0.0, 1.0])
    means = masked_means_over_processes(values, mask, lambda totals: totals, active_rows=active)
    assert means == {"clip": 0.5, "entropy": (2.0 + 4.0 + 9.0) / 3}
    assert masked_means_over_processes(values, mask, lambda totals: totals)["clip"] == 0.25  # TRL's: every row


def test_a_metric_with_nothing_to_average_is_left_out():
    """A micro-batch of filler groups only (every row dropped): its per-token metrics, such as
    ``async/sampler_ratio/mean``, have no token on any process and are left out instead of logged as 0.0."""
    mask = torch.zeros(2, 3)
    values = {"async/sampler_ratio/mean": torch.ones(2, 3), "seq": torch.ones(2, 1)}
    means = masked_means_over_processes(values, mask, lambda totals: totals, active_rows=torch.zeros(2))
    assert means == {}
    assert masked_means_over_processes(values, mask, lambda totals: totals) == {"seq": 1.0}  # every row, as TRL
