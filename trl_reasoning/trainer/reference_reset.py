"""The reference reset (ProRL, arXiv 2505.24864): the KL reference is hard-reset to the current policy and the
optimizer's state is cleared, every ``reference_reset_steps`` optimizer steps or when the KL to the reference passes
``reference_reset_kl``.

Any trainer of the package takes it from its config (``ReasoningConfig.reference_reset_steps`` /
``reference_reset_kl``, which need ``beta != 0``); :func:`reference_reset_for` builds it, and the trainer feeds it the
loss's KL, saves it with every checkpoint and restores it on resume.

What a reset is:

- **Full fine-tuning**: TRL scores the reference with ``GRPOTrainer.ref_model``, a second copy of the model; a reset
  copies the policy's parameters into it, in place (no memory beyond TRL's copy). TRL's ``sync_ref_model`` mixes the
  two (``ref_model_mixup_alpha``); this is the hard copy, and the two are refused together.
- **LoRA (PEFT)**: TRL scores the reference with the adapters disabled (the base model), or, when the model holds an
  adapter called ``"ref"``, with that adapter instead of the trained one. The first reset adds that frozen ``"ref"``
  adapter, with the trained adapter's config, and every reset copies the trained adapter's weights into it, so the
  reference becomes base + the adapter as it was at the reset. The cost is one more adapter's weights (the size of
  the trained one; the base model is shared), in memory and in each checkpoint (PEFT saves it under ``ref/``).
- **The optimizer**: the state of the underlying torch optimizer (AdamW's moments and step counts) is dropped;
  optimizers of ``torch.optim`` rebuild it at their next step as at the first. The learning-rate scheduler is left
  alone: it goes on with its own schedule (ProRL trains at a constant learning rate, so a reset does not change it).

A reset happens at the end of an optimizer step that closes a rollout batch (TRL's ``_step`` at a multiple of
``steps_per_generation * num_iterations``): the reference log-probs of a rollout batch are computed once, when it is
scored, so resetting inside one would leave its remaining steps on the old reference. A schedule that falls inside a
rollout batch resets at the first boundary after it. Every process takes the same decision: the step schedule is the
same everywhere, and the KL trigger reads the KL averaged over processes, with the decision reduced across them.

What a checkpoint keeps: ``trl_reasoning_reference_state.json`` (resets so far, the step of the last one, the KL seen
since the last rollout boundary) and, after a first reset, ``trl_reasoning_reference.safetensors`` (the reference's
weights: the whole model, or the ``"ref"`` adapter). Both are written before ``trainer_state.json``. DeepSpeed and
FSDP shard the reference and the optimizer's state; the reset is refused there, at construction.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors.torch import load_file, save_file
from transformers import TrainerCallback

from ..utils.user_warnings import user_stacklevel
from .checkpoints import safetensors_problem, write_json_atomically

#: The reset's state file and the reference's weights, in every checkpoint folder of a run with the reset.
REFERENCE_STATE_FILE = "trl_reasoning_reference_state.json"
REFERENCE_WEIGHTS_FILE = "trl_reasoning_reference.safetensors"
#: The adapter name TRL's GRPOTrainer scores the reference with, when a PEFT model holds it.
REFERENCE_ADAPTER = "ref"
#: The config fields that turn the reset on (named by every error).
RESET_FIELDS = ("reference_reset_steps", "reference_reset_kl")


class ReferenceResetError(ValueError):
    """A checkpoint's reference state cannot be restored, or the run cannot reset its reference."""


class ReferenceResetHost(Protocol):
    """What the reset reads from the trainer: its config, the policy and TRL's reference, the optimizer, the
    accelerator, TRL's metrics and micro-batch counter (``GRPOTrainer._step``), ``num_iterations`` and the KL
    coefficient ``beta``."""

    args: Any
    model: torch.nn.Module
    ref_model: torch.nn.Module | None
    optimizer: Any
    accelerator: Any
    num_iterations: int
    beta: float
    _metrics: dict
    _step: int


@dataclasses.dataclass
class ResetState:
    """The reset's state, saved with each checkpoint: ``resets`` so far, the optimizer step of the last one, and the
    KL seen since the last rollout boundary (a sum and a count of micro-batch means)."""

    resets: int = 0
    last_reset_step: int | None = None
    kl_sum: float = 0.0
    kl_count: int = 0


def innermost_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer inside accelerate's ``AcceleratedOptimizer`` (and any wrapper that keeps it as
    ``.optimizer``): the one whose ``state`` holds the moments."""
    inner = optimizer
    while isinstance(getattr(inner, "optimizer", None), torch.optim.Optimizer):
        inner = inner.optimizer
    return inner


def reset_optimizer_state(optimizer: Any) -> int:
    """Drop the per-parameter state of ``optimizer`` (AdamW's ``exp_avg``, ``exp_avg_sq`` and ``step``); returns how
    many parameters had one. The parameter groups (learning rate, weight decay) stay."""
    inner = innermost_optimizer(optimizer)
    dropped = len(inner.state)
    inner.state.clear()
    return dropped


def trained_adapter(model: torch.nn.Module) -> str:
    """The adapter a PEFT model trains (its active adapter); it cannot be the reference's own."""
    name = model.active_adapter
    if name == REFERENCE_ADAPTER:
        raise ReferenceResetError(
            f"The PEFT model trains an adapter called {REFERENCE_ADAPTER!r}, the name TRL gives the reference adapter; "
            "rename the adapter to reset the reference (reference_reset_steps / reference_reset_kl)."
        )
    return name


def reference_adapter_names(model: torch.nn.Module) -> dict[str, str]:
    """``{trained adapter parameter name: reference adapter parameter name}`` for every parameter of the trained
    adapter (LoRA's A and B, and any ``modules_to_save`` copy)."""
    trained = trained_adapter(model)
    return {
        name: name.replace(f".{trained}.", f".{REFERENCE_ADAPTER}.")
        for name, _ in model.named_parameters()
        if f".{trained}." in name
    }


def ensure_reference_adapter(model: torch.nn.Module) -> None:
    """Add the frozen ``"ref"`` adapter (the trained adapter's config) if the model lacks it, and keep it frozen and
    without dropout whoever added it (transformers' resume loads a checkpoint's adapter folders with their saved
    config, ``lora_dropout=0.1`` included); the trained adapter stays the active one."""
    if REFERENCE_ADAPTER not in model.peft_config:
        config = copy.deepcopy(model.peft_config[trained_adapter(model)])
        config.inference_mode = True
        model.add_adapter(REFERENCE_ADAPTER, config)
    names = set(reference_adapter_names(model).values())
    for name, param in model.named_parameters():
        if name in names:
            param.requires_grad_(False)
    for name, module in model.named_modules():  # the reference is scored without dropout (LoRA's lora_dropout)
        if name.endswith(f".{REFERENCE_ADAPTER}") and isinstance(module, torch.nn.Dropout):
            module.p = 0.0


@torch.no_grad()
def copy_parameters(source: dict[str, torch.Tensor], target: dict[str, torch.nn.Parameter], what: str) -> None:
    """Copy ``source`` into ``target`` by name; the two must hold the same names (``what`` names the pair in the
    error)."""
    if set(source) != set(target):
        missing, extra = sorted(set(target) - set(source)), sorted(set(source) - set(target))
        raise ReferenceResetError(
            f"{what}: the parameter names differ (missing {missing[:3]}, unexpected {extra[:3]}), so the reference "
            "cannot be set from it."
        )
    for name, param in target.items():
        param.copy_(source[name].to(device=param.device, dtype=param.dtype))


def read_reset_state(checkpoint: str | os.PathLike) -> ResetState | None:
    """The reset state saved in ``checkpoint`` (``None`` when the file is missing); a damaged file is a
    :class:`ReferenceResetError` naming it."""
    path = Path(checkpoint) / REFERENCE_STATE_FILE
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        state = ResetState(**data)
    except (json.JSONDecodeError, TypeError, UnicodeDecodeError) as error:
        raise ReferenceResetError(
            f"{path} is damaged ({type(error).__name__}: {error}). Resume from an earlier checkpoint."
        ) from None
    if not isinstance(state.resets, int) or state.resets < 0:
        raise ReferenceResetError(f"{path} has a malformed 'resets' entry. Resume from an earlier checkpoint.")
    return state


class ReferenceReset(TrainerCallback):
    """The reset of one trainer: decides at the end of each optimizer step, resets, logs ``reference/resets`` and
    ``reference/last_reset_step``, and saves and restores its state and the reference's weights."""

    def __init__(self, host: ReferenceResetHost, every_steps: int | None, kl_threshold: float | None) -> None:
        self.host = host
        self.every_steps = every_steps
        self.kl_threshold = kl_threshold
        self.state = ResetState()

    # ------------------------------------------------------------------------------------------------ deciding
    def observe_kl(self, kl: float) -> None:
        """Record one micro-batch's KL to the reference (its token mean, averaged over processes)."""
        self.state.kl_sum += float(kl)
        self.state.kl_count += 1

    def at_rollout_boundary(self) -> bool:
        """Whether the next training micro-batch starts a new rollout batch (TRL's own rule in ``_prepare_inputs``)."""
        return self.host._step % (self.host.args.steps_per_generation * self.host.num_iterations) == 0

    def due(self, step: int) -> bool:
        """Whether a reset is due at the end of optimizer step ``step`` (a rollout boundary): the schedule has come
        round since the last reset (or the start), or the mean KL of the rollout batch just trained passed the
        threshold on any process."""
        kl = self.state.kl_sum / self.state.kl_count if self.state.kl_count else None
        self.state.kl_sum, self.state.kl_count = 0.0, 0
        on_schedule = self.every_steps is not None and step - (self.state.last_reset_step or 0) >= self.every_steps
        if self.kl_threshold is None:
            return on_schedule
        over = kl is not None and kl > self.kl_threshold
        flag = torch.tensor([float(over)], device=self.host.accelerator.device)
        over = self.host.accelerator.reduce(flag, reduction="sum").item() > 0
        return on_schedule or over

    def on_train_begin(self, args, state, control, **kwargs):
        """A ``train()`` that starts at step 0 again (a second ``train()`` on the same trainer, not a resume) counts
        its schedule from its own start: the Trainer's step restarts at 0, so a last reset at a step of the previous
        run would put every scheduled reset out of reach. The reset count goes on; the KL seen is dropped."""
        if self.state.last_reset_step is not None and state.global_step < self.state.last_reset_step:
            self.state.last_reset_step = None
            self.state.kl_sum, self.state.kl_count = 0.0, 0
        return control

    def on_step_end(self, args, state, control, **kwargs):
        if self.at_rollout_boundary() and self.due(state.global_step):
            self.reset(state.global_step)
        metrics = self.host._metrics["train"]
        # one value per logging window (TRL averages each list): the state at the window's last step
        metrics["reference/resets"] = [float(self.state.resets)]
        if self.state.last_reset_step is not None:
            metrics["reference/last_reset_step"] = [float(self.state.last_reset_step)]
        return control

    # ------------------------------------------------------------------------------------------------ resetting
    def _policy(self) -> torch.nn.Module:
        return self.host.accelerator.unwrap_model(self.host.model)

    def _reference_parameters(self) -> dict[str, torch.nn.Parameter]:
        """The parameters that hold the reference, by the policy's names: the reference model's, or the ``"ref"``
        adapter's keyed by the trained adapter's names."""
        if self.host.ref_model is not None:
            return dict(self.host.accelerator.unwrap_model(self.host.ref_model).named_parameters())
        policy = self._policy()
        ensure_reference_adapter(policy)
        params = dict(policy.named_parameters())
        return {trained: params[ref] for trained, ref in reference_adapter_names(policy).items()}

    def _policy_parameters(self) -> dict[str, torch.Tensor]:
        params = dict(self._policy().named_parameters())
        if self.host.ref_model is not None:
            return params
        return {name: params[name] for name in reference_adapter_names(self._policy())}

    def reset(self, step: int) -> None:
        """Reference := the current policy, and a fresh optimizer state, at the end of optimizer step ``step``."""
        copy_parameters(self._policy_parameters(), self._reference_parameters(), "the policy")
        reset_optimizer_state(self.host.optimizer)
        self.state.resets += 1
        self.state.last_reset_step = step

    # ------------------------------------------------------------------------------------------------ checkpoints
    def reference_weights(self) -> dict[str, torch.Tensor]:
        """The reference's weights (by the policy's parameter names), as CPU tensors."""
        return {name: param.detach().cpu().contiguous() for name, param in self._reference_parameters().items()}

    def leave_adapter_out(self, folder: str | os.PathLike) -> None:
        """Remove the ``"ref"`` adapter's folder PEFT writes beside the trained adapter in a saved model (the final
        model, a checkpoint): the reference is training state, kept in this part's own file
        (``REFERENCE_WEIGHTS_FILE``), and a model pushed to the Hub carries the trained adapter alone."""
        if self.host.ref_model is None and os.path.isdir(Path(folder) / REFERENCE_ADAPTER):
            shutil.rmtree(Path(folder) / REFERENCE_ADAPTER)

    def save(self, folder: str | os.PathLike, write: bool = True) -> None:
        """Write the reset state, and after a first reset the reference's weights, into ``folder`` (a checkpoint),
        each atomically (the weights first). ``write``: this process saves (the others hold the same state)."""
        if not write:
            return
        os.makedirs(folder, exist_ok=True)
        if self.state.resets:
            handle, temporary = tempfile.mkstemp(prefix=f".{REFERENCE_WEIGHTS_FILE}.", suffix=".tmp", dir=folder)
            os.close(handle)
            try:
                save_file(self.reference_weights(), temporary)
                os.replace(temporary, os.path.join(folder, REFERENCE_WEIGHTS_FILE))
            except BaseException:
                Path(temporary).unlink(missing_ok=True)
                raise
        write_json_atomically(os.path.join(folder, REFERENCE_STATE_FILE), dataclasses.asdict(self.state))

    def restore(self, checkpoint: str | os.PathLike) -> None:
        """Load the reset state and the reference of ``checkpoint`` (every process). A checkpoint without the state
        file (written before the reset was turned on) resumes with the reference TRL built, and no reset so far."""
        state = read_reset_state(checkpoint)
        if state is None:
            warnings.warn(
                f"{Path(checkpoint) / REFERENCE_STATE_FILE} is missing: this resume counts no reference reset so far "
                "and keeps the reference TRL built. If the run reset its reference before this checkpoint, that "
                "reference is lost; copy the file (and the reference's weights) with the checkpoint to resume exactly.",
                UserWarning,
                stacklevel=user_stacklevel(),
            )
            return
        if state.resets:
            path = Path(checkpoint) / REFERENCE_WEIGHTS_FILE
            if not path.is_file():
                raise ReferenceResetError(
                    f"{checkpoint} records {state.resets} reference reset(s) but has no {REFERENCE_WEIGHTS_FILE}, so "
                    "the reference it trained against is lost. Resume from a complete checkpoint."
                )
            problem = safetensors_problem(path)
            if problem is not None:
                raise ReferenceResetError(
                    f"{path} is damaged ({problem}). Resume from an earlier checkpoint, or with "
                    "resume_from_checkpoint=True, which passes over damaged checkpoints."
                )
            copy_parameters(load_file(str(path)), self._reference_parameters(), str(path))
        # a checkpoint inside a rollout batch: the resumed run samples that batch again, so its KL starts afresh
        state.kl_sum, state.kl_count = 0.0, 0
        self.state = state


def shards_the_reference(host: ReferenceResetHost) -> bool:
    """Whether the run shards the reference model and the optimizer's state (DeepSpeed or FSDP), which a reset
    cannot copy into or clear."""
    return bool(getattr(host, "is_deepspeed_enabled", False) or getattr(host, "is_fsdp_enabled", False))


def reference_kept_on_resume(host: ReferenceResetHost, checkpoint: str | os.PathLike) -> ReferenceReset | None:
    """For a run resumed with neither reset field set from a checkpoint whose run reset its reference: a
    :class:`ReferenceReset` that never resets, so the run goes on against the reference the checkpoint saved (not the
    initial one TRL built) and keeps saving it with its own checkpoints. ``None`` when there is nothing to keep: no
    reset recorded, or no KL term (``beta=0``: no reference is scored)."""
    state = read_reset_state(checkpoint)
    if state is None or not state.resets or host.beta == 0.0:
        return None
    if shards_the_reference(host):
        warnings.warn(
            f"{checkpoint} records {state.resets} reference reset(s), but this run (DeepSpeed or FSDP) cannot load a "
            "reference into its sharded reference model: it trains against the reference TRL built from the initial "
            "weights. Resume with DDP (or one process) to keep the checkpoint's reference.",
            UserWarning,
            stacklevel=user_stacklevel(),
        )
        return None
    warnings.warn(
        f"{checkpoint} records {state.resets} reference reset(s) (the last at step {state.last_reset_step}) and "
        "reference_reset_steps and reference_reset_kl are off: the run goes on against the checkpoint's reference, "
        "without further resets.",
        UserWarning,
        stacklevel=user_stacklevel(),
    )
    return ReferenceReset(host, None, None)


def reference_reset_for(host: ReferenceResetHost) -> ReferenceReset | None:
    """The reset the config asks for (``None`` when neither field is set), or an error naming the fields where the
    run cannot reset: DeepSpeed and FSDP shard the reference and the optimizer's state."""
    args = host.args
    every, threshold = getattr(args, "reference_reset_steps", None), getattr(args, "reference_reset_kl", None)
    if every is None and threshold is None:
        return None
    if shards_the_reference(host):
        raise ReferenceResetError(
            f"reference_reset_steps={every} / reference_reset_kl={threshold}: the reference reset is not supported "
            "with DeepSpeed or FSDP, which shard the reference model and the optimizer's state. Train with DDP (or "
            "one process), or set reference_reset_steps=None and reference_reset_kl=None."
        )
    return ReferenceReset(host, every, threshold)
