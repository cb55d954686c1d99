"""vLLM paths. vLLM needs CUDA and cannot run here: what can be checked without it is checked (config wiring, the
error without vLLM, how the loss uses vLLM's outputs); a real colocated run is a GPU-only test."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from conftest import cpu_args, digit_fraction, generate_batch

import trl_reasoning as tr

HAS_VLLM = importlib.util.find_spec("vllm") is not None
HAS_CUDA = torch.cuda.is_available()


@pytest.mark.parametrize("name", ["DAPO", "CISPO", "ProRL", "DPPO", "MaxRL", "RLOO", "DrGRPO"])
def test_vllm_colocate_config_wiring(name):
    config = getattr(tr, f"{name}Config")(
        **cpu_args(),
        use_vllm=True,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=0.3,
        vllm_importance_sampling_correction=True,
        vllm_importance_sampling_mode="token_truncate",
    )
    assert (config.use_vllm, config.vllm_mode, config.vllm_gpu_memory_utilization) == (True, "colocate", 0.3)
    assert config.vllm_importance_sampling_correction


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed")
def test_use_vllm_without_vllm_is_a_clear_error(tiny_model_path, prompts):
    with pytest.raises(ImportError, match="vLLM is not available"):
        tr.DAPOTrainer(
            model=tiny_model_path,
            reward_funcs=digit_fraction,
            args=tr.DAPOConfig(**cpu_args(), use_vllm=True, vllm_mode="colocate"),
            train_dataset=prompts,
        )


def _loss(trainer, inputs) -> torch.Tensor:
    trainer.current_gradient_accumulation_steps = 1
    with torch.no_grad():
        return trainer.compute_loss(trainer.model, inputs)


@pytest.mark.parametrize("policy_loss", ["clip", "cispo", "sequence_clip", "dppo"])
def test_loss_uses_vllm_importance_sampling_like_trl(policy_loss, tiny_model_path, prompts, tmp_path):
    """With TRL's vLLM IS correction on, the per-token loss is multiplied by the IS ratio (as in TRL); DPPO instead
    takes its ratio against vLLM's sampling log-probs, so the correction is not applied twice."""
    args = tr.ReasoningConfig(**cpu_args(output_dir=str(tmp_path)), policy_loss=policy_loss, epsilon_high=5.0)
    trainer = tr.ReasoningTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=args, train_dataset=prompts)
    inputs = generate_batch(trainer)
    baseline = _loss(trainer, inputs)
    assert baseline != 0

    # Pretend the batch came from vLLM: a uniform IS ratio of 0.5 and sampling log-probs equal to the policy's.
    trainer.use_vllm, trainer.vllm_importance_sampling_correction = True, True
    old = trainer.behaviour_logps(inputs)
    vllm_inputs = {
        **inputs,
        "importance_sampling_ratio": torch.full_like(old, 0.5),
        "sampling_per_token_logps": old.clone(),
    }
    corrected = _loss(trainer, vllm_inputs)
    if policy_loss == "dppo":
        torch.testing.assert_close(corrected, baseline, rtol=1e-5, atol=1e-7)
        # ...and DPPO's ratio does use vLLM's log-probs: shifting them changes the loss.
        shifted = {**vllm_inputs, "sampling_per_token_logps": old - 0.3}
        assert not torch.allclose(_loss(trainer, shifted), baseline)
    else:
        torch.testing.assert_close(corrected, 0.5 * baseline, rtol=1e-5, atol=1e-7)


@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_VLLM and HAS_CUDA), reason="needs vLLM and a CUDA GPU")
def test_vllm_colocate_trains(tiny_model_path, prompts, tmp_path):  # pragma: no cover - GPU only
    args = tr.DAPOConfig(
        **{**cpu_args(output_dir=str(tmp_path)), "use_cpu": False},
        use_vllm=True,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=0.2,
        vllm_importance_sampling_correction=True,
    )
    trainer = tr.DAPOTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=args, train_dataset=prompts)
    trainer.train()
    assert all(torch.isfinite(torch.tensor(e["loss"])) for e in trainer.state.log_history if "loss" in e)
