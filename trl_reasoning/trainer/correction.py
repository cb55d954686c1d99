"""The importance-sampling correction between ``pi_old`` and the sampler ``mu``: TRL's vLLM correction (its modes and
metrics) and this package's, on a vLLM batch or an asynchronous one, and what the ratio of the loss is anchored to.

:class:`ImportanceCorrection` is a part of :class:`trl_reasoning.trainer.base.ReasoningTrainer`, composed
(``trainer.correction``). It decides, when the trainer is built:

- the ratio anchor (``args.ratio_anchor`` where the config left it to the trainer) and the warnings of a run whose
  objective has no trust region against the sampler, or whose correction mode its ratio makes moot;
- where the correction's weight is built (:meth:`ImportanceCorrection.importance_sampling_source`): nowhere, in the
  loss from its own forward, by TRL at scoring, or by this package at scoring;

and then, at each batch: which of TRL's scoring builds the correction (:meth:`~ImportanceCorrection.scoring`), the
weight built at scoring or in the loss, the ratio's denominator (``pi_old``, or ``mu`` for ``ratio_anchor="sampler"``),
and the metrics: TRL's ``sampling/*``, the effective sample size, the share of weights a mode changed and the spread of
``pi_theta / mu``.

It never touches TRL's private methods: its host (the trainer) lends it exactly what :class:`CorrectionHost` names
(the seam, checked when a trainer is built): ``behaviour_logps(output)`` (a no-grad forward of the policy now, where
TRL did not compute ``pi_old``), the asynchronous rollouts, the Trainer's state and TRL's correction settings, which
the trainer's TRL-API guard (``trl_api.TRL_INSTANCE_ATTRIBUTES``) checks.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

import torch

from ..algorithms.importance_sampling import (
    TRL_DEFAULT_CORRECTION_MODE,
    TRL_IMPORTANCE_SAMPLING_MODES,
    CorrectionStats,
    correction_weight,
    effective_sample_size_terms,
    ess_from_terms,
    weight_share_changed,
)
from ..algorithms.losses import POLICY_LOSSES, ratio_anchors
from ..algorithms.truncation import sampling_truncation
from ..utils.user_warnings import user_stacklevel
from .rollout import loss_tokens


@runtime_checkable
class CorrectionHost(Protocol):
    """What :class:`ImportanceCorrection` reads from (and, where marked, writes to) its trainer. Members from
    ``GRPOTrainer.__init__`` are in the TRL-API guard (``trl_reasoning.trainer.trl_api.TRL_INSTANCE_ATTRIBUTES``)."""

    # lent by trl-reasoning's trainer
    def behaviour_logps(self, output: dict) -> torch.Tensor: ...

    async_rollouts: Any  # None on a synchronous run

    # transformers.Trainer's
    args: Any  # written: the resolved ratio_anchor (ReasoningConfig.resolve_ratio_anchor)
    accelerator: Any
    model: Any

    # GRPOTrainer's (TRL_INSTANCE_ATTRIBUTES)
    use_vllm: bool
    num_iterations: int
    _step: int
    vllm_importance_sampling_correction: bool  # written: around TRL's scoring, then restored
    vllm_importance_sampling_mode: str  # written: the decoupled anchor's truncation
    vllm_importance_sampling_clip_min: float
    vllm_importance_sampling_clip_max: float
    _metrics: dict  # written: the correction's metrics


def uses_trl_is_ratio(args: Any) -> bool:
    """Whether the loss uses TRL's vLLM importance-sampling ratio: not when its own ratio is taken against the
    rollout engine or the sampler (DPPO; ``ratio_anchor="sampler"``: the mismatch would count twice)."""
    return not (
        POLICY_LOSSES.traits(args.policy_loss).ratio_to_rollout or getattr(args, "ratio_anchor", None) == "sampler"
    )


class ImportanceCorrection:
    """The importance-sampling correction of a trainer (its ``correction``): built once the asynchronous rollouts
    are (it resolves the ratio anchor they may change); reads the trainer only through :class:`CorrectionHost`.

    ``source``: where the weight is built (:meth:`importance_sampling_source`); ``stats``: its metrics of the
    generation batch being trained on, per mode (accumulated over the micro-batches when the loss builds it)."""

    def __init__(self, host: CorrectionHost) -> None:
        self.host = host
        self.resolve_ratio_anchor()
        self.warn_if_mode_ignored()
        self.source = self.importance_sampling_source()
        self.stats = {
            mode: CorrectionStats(
                host.vllm_importance_sampling_mode,
                host.vllm_importance_sampling_clip_min,
                host.vllm_importance_sampling_clip_max,
            )
            for mode in ("train", "eval")
        }

    @property
    def uses_trl_is_ratio(self) -> bool:
        """:func:`uses_trl_is_ratio` of the host's config."""
        return uses_trl_is_ratio(self.host.args)

    # ------------------------------------------------------------------ when the trainer is built
    def resolve_ratio_anchor(self) -> None:
        """``args.ratio_anchor`` where the config left it to the trainer (``async_rollouts=None``), and the one warning
        of an asynchronous run whose objective has no trust region against the sampler."""
        host = self.host
        args, asynchronous = host.args, host.async_rollouts is not None
        loss = args.policy_loss
        if args.ratio_anchor is None:
            args.resolve_ratio_anchor(asynchronous)
            # TRL copied the mode onto the trainer in its __init__: the decoupled anchor's truncation goes on both
            host.vllm_importance_sampling_mode = args.vllm_importance_sampling_mode
        truncation = sampling_truncation(args.top_k, args.top_p, args.min_p, args.generation_kwargs)
        chosen = "pi_old" in ratio_anchors(loss)  # DPPO's ratio is the sampler's by definition, not a choice
        if (
            args.ratio_anchor == "sampler"
            and chosen
            and not asynchronous
            and not host.use_vllm
            and truncation.truncates
        ):
            warnings.warn(
                "ratio_anchor='sampler' on a synchronous run sampled by generate: the sampler's log-probabilities are "
                "not recorded there, so the ratio is taken against pi_old, the policy scored on the whole vocabulary, "
                f"while the sampler drew from its truncated distribution ({truncation}). Set async_rollouts=True "
                "(max_staleness=0 samples from the current weights), which records mu, to take the ratio to the "
                "sampler as asked.",
                UserWarning,
                stacklevel=user_stacklevel(),
            )
        if asynchronous and args.ratio_anchor == "pi_old" and not POLICY_LOSSES.traits(loss).own_is_correction:
            steps = args.steps_per_generation * host.num_iterations
            where = (
                "the learner itself (one optimizer step per generation batch), so its ratio is 1 and it never acts"
                if steps == 1
                else f"the weights that scored the batch, so it acts only within the {steps} optimizer steps of a batch"
            )
            warnings.warn(
                f"ratio_anchor='pi_old' with asynchronous rollouts: policy_loss={loss!r} takes its ratio against "
                f"pi_old, {where}; nothing bounds the update against the policy that sampled ({args.max_staleness} "
                "generation steps earlier) but TRL's importance-sampling correction (vllm_importance_sampling_mode="
                f"{args.vllm_importance_sampling_mode!r}). Set ratio_anchor='sampler' (verl's bypass mode) or "
                "'decoupled' (AReaL) for a trust region against the sampler.",
                UserWarning,
                stacklevel=user_stacklevel(),
            )

    def warn_if_mode_ignored(self) -> None:
        """A ``vllm_importance_sampling_mode`` set away from TRL's default on a run whose loss takes its ratio against
        the sampler (DPPO, ``ratio_anchor="sampler"``): the mode is not applied (the mismatch would count twice), and
        a setting the user chose is never dropped without a word."""
        host = self.host
        mode = host.args.vllm_importance_sampling_mode
        reads_mu = host.use_vllm or host.async_rollouts is not None
        if not reads_mu or self.uses_trl_is_ratio or mode == TRL_DEFAULT_CORRECTION_MODE:
            return
        warnings.warn(
            f"vllm_importance_sampling_mode={mode!r} is not applied: policy_loss={host.args.policy_loss!r} takes its "
            "ratio against the sampler itself (ratio_anchor='sampler'), so TRL's correction of pi_old / mu would "
            "count the mismatch twice. Set ratio_anchor='pi_old' (or 'decoupled') to train with that correction, or "
            "drop vllm_importance_sampling_mode.",
            UserWarning,
            stacklevel=user_stacklevel(),
        )

    def importance_sampling_source(self) -> str | None:
        """Where the weight of TRL's importance-sampling correction between ``pi_old`` and the sampler is built:

        - ``None``: nowhere (the correction is off, the run samples neither with vLLM nor asynchronously, or the loss
          takes its ratio against the sampler itself: DPPO, asynchronous CISPO). TRL is not asked for it either, which
          skips TRL's no-grad forward for ``pi_old`` where TRL ran it only for the correction.
        - ``"loss"``: in ``_compute_loss``, from the loss forward's own detached log-probs. Exact when the weights do
          not change between a batch's scoring and its loss: ``gradient_accumulation_steps`` is a multiple of
          ``steps_per_generation * num_iterations`` (TRL's own condition for dropping ``pi_old``), so every
          generation batch is scored and trained within one optimizer step. TRL's forward for ``pi_old`` is skipped.
        - ``"trl"``: TRL's own code at scoring (its forward, ratio and metrics): TRL's modes where ``"loss"`` is not
          exact or ``importance_sampling_pi_old_from_loss=False``.
        - ``"scoring"``: this package's modes where ``"loss"`` is not taken: built at scoring from TRL's ``pi_old``
          (or from a forward of the same weights when TRL does not compute it)."""
        host = self.host
        args = host.args
        if not (args.vllm_importance_sampling_correction and self.uses_trl_is_ratio):
            return None
        if not (host.use_vllm or host.async_rollouts is not None):
            return None
        one_update_per_batch = (
            args.gradient_accumulation_steps % (args.steps_per_generation * host.num_iterations) == 0
        )
        if args.importance_sampling_pi_old_from_loss and one_update_per_batch:
            return "loss"
        return "trl" if host.vllm_importance_sampling_mode in TRL_IMPORTANCE_SAMPLING_MODES else "scoring"

    # ------------------------------------------------------------------ at scoring
    @contextlib.contextmanager
    def scoring(self) -> Iterator[bool]:
        """Around TRL's scoring of a batch: an asynchronous batch takes TRL's vLLM path (``AsyncRollouts.scoring``),
        and TRL builds its importance-sampling correction only where :meth:`importance_sampling_source` says
        ``"trl"`` (elsewhere its no-grad forward for ``pi_old`` would only feed a correction built here, or none).
        Yields whether the correction applies to this batch."""
        host = self.host
        async_scoring = host.async_rollouts.scoring() if host.async_rollouts is not None else contextlib.nullcontext()
        with async_scoring:
            requested = host.vllm_importance_sampling_correction
            applies = bool(requested and host.use_vllm and self.source is not None)
            host.vllm_importance_sampling_correction = requested and self.source == "trl"
            try:
                yield applies
            finally:
                host.vllm_importance_sampling_correction = requested

    def at_scoring(self, output: dict) -> None:
        """This package's modes where the loss cannot build the weight: from TRL's ``pi_old`` (or, where TRL skipped
        it, a no-grad forward of the same weights), at scoring, with TRL's metrics."""
        host = self.host
        old = output.get("old_per_token_logps")
        if old is None:
            old = host.behaviour_logps(output)
            output["old_per_token_logps"] = old
        mask = loss_tokens(output)
        sampler = output["sampling_per_token_logps"]
        weight = self.weight(old, sampler, mask)
        output["importance_sampling_ratio"] = weight
        mode = "train" if host.model.training else "eval"
        self.stats[mode].add(old, sampler, mask, weight)
        self.log_stats(mode)

    def log_trl_correction(self, output: dict) -> None:
        """Next to TRL's own ``sampling/*`` metrics: the effective sample size of its weights and, on an asynchronous
        batch, the share of weights its mode changed."""
        host = self.host
        mode = "train" if host.model.training else "eval"
        ratio, mask = output["importance_sampling_ratio"], loss_tokens(output)
        sampling_mode = host.vllm_importance_sampling_mode
        device = host.accelerator.device
        terms = host.accelerator.reduce(effective_sample_size_terms(ratio, mask, sampling_mode).to(device), "sum")
        host._metrics[mode]["sampling/effective_sample_size"].append(ess_from_terms(terms))
        if host.async_rollouts is not None and mode == "train":
            changed, counted = weight_share_changed(
                ratio,
                mask,
                sampling_mode,
                host.vllm_importance_sampling_clip_min,
                host.vllm_importance_sampling_clip_max,
            )
            share = torch.tensor([changed / counted if counted else 0.0], device=device)
            host._metrics[mode]["async/is_weight_changed"].append(host.accelerator.gather(share).mean().item())

    # ------------------------------------------------------------------ the weight and its metrics
    def weight(self, old_logps, sampler_logps, mask) -> torch.Tensor:
        """The correction's per-token weight of ``pi_old / mu`` in the host's mode."""
        host = self.host
        return correction_weight(
            old_logps,
            sampler_logps,
            mask,
            host.vllm_importance_sampling_mode,
            host.vllm_importance_sampling_clip_min,
            host.vllm_importance_sampling_clip_max,
        )

    def log_stats(self, mode: str) -> None:
        """Log the accumulated correction metrics of one generation batch (a collective: every process calls it at
        the same point)."""
        host = self.host
        values = self.stats[mode].reduce(host.accelerator.gather, host.accelerator.device)
        changed = values.pop("is_weight_changed")
        for key, value in values.items():
            host._metrics[mode][key].append(value)
        if host.async_rollouts is not None and mode == "train":
            host._metrics[mode]["async/is_weight_changed"].append(changed)

    # ------------------------------------------------------------------ in the loss
    def loss_side(self, inputs, per_token_logps, mode: str) -> dict:
        """``inputs`` with the importance-sampling weight built from this forward's detached log-probs (``pi_old``
        exactly, see :meth:`importance_sampling_source`), where TRL's scoring did not build one; it is then applied
        exactly where TRL's ratio is. TRL's ``sampling/*`` metrics (and the ESS) are accumulated over the micro-batches
        of the generation batch and logged once, after its last: the values ``GRPOTrainer`` logs at scoring."""
        host = self.host
        if (
            self.source != "loss"
            or "importance_sampling_ratio" in inputs
            or "sampling_per_token_logps" not in inputs
            or not (host.use_vllm or (host.async_rollouts is not None and mode == "train"))
        ):
            return inputs
        old = inputs.get("old_per_token_logps")
        old = per_token_logps.detach() if old is None else old
        sampler, mask = inputs["sampling_per_token_logps"], loss_tokens(inputs)
        weight = self.weight(old, sampler, mask)
        if mode == "eval":  # one generation batch is one evaluation batch
            self.stats[mode].add(old, sampler, mask, weight)
            self.log_stats(mode)
        else:
            # TRL's buffer: micro-batch host._step % steps_per_generation of the generation batch, trained
            # num_iterations times; its metrics are those of its first pass
            position = host._step % (host.args.steps_per_generation * host.num_iterations)
            if position < host.args.steps_per_generation:
                self.stats[mode].add(old, sampler, mask, weight)
            if position == host.args.steps_per_generation - 1:
                self.log_stats(mode)
        return {**inputs, "importance_sampling_ratio": weight}

    def ratio_denominator(self, old_per_token_logps, sampler) -> torch.Tensor:
        """The log-probs the loss's ratio is taken against: ``pi_old``, or the sampler's ``mu`` itself for a loss
        anchored to the sampler (verl's bypass mode; CISPO and DPPO on an asynchronous batch; ``pi_old`` where the
        sampler gave none). getattr: TRL's own tests build trainers without ReasoningConfig's defaults resolved."""
        if sampler is not None and getattr(self.host.args, "ratio_anchor", None) == "sampler":
            return torch.where(torch.isnan(sampler), old_per_token_logps, sampler)
        return old_per_token_logps

    def sampler_ratio_stats(self, per_token_logps, sampler, stats: dict[str, torch.Tensor]) -> None:
        """Into ``stats``, on an asynchronous training batch whose loss takes its ratio against the sampler (TRL's
        ``sampling/*`` metrics are not made): the spread of ``pi_theta / mu``, the ratio CISPO and DPPO weight by."""
        host = self.host
        if host.async_rollouts is None or not host.model.training or sampler is None or self.uses_trl_is_ratio:
            return
        log_ratio = torch.nan_to_num(per_token_logps.detach() - sampler)
        stats["async/sampler_ratio/mean"] = log_ratio.exp()
        stats["async/sampler_ratio/abs_log_mean"] = log_ratio.abs()
        # with the mean, the effective sample size of these weights: mean(w)^2 / mean(w^2)
        stats["async/sampler_ratio/sq_mean"] = (2 * log_ratio).exp()
