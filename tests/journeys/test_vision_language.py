"""Journey: a user training a vision-language model (Qwen2-VL) with GRPO swaps in every trainer of this package.

None of TRL's VLM tests can be rebuilt offline (their fixtures live on the hub), so this builds a tiny Qwen2-VL from
configs (``trl_reasoning.models.tiny_vlm``) and runs the same script with ``GRPOTrainer`` and with every trainer here:
image prompts of two sizes (4 and 16 patches), conversational, the images in an ``image`` column as TRL documents.
DAPO's dynamic sampling regroups rows of several generation rounds, images included; DPPO's top-K forward passes the
images to the model; LoRA trains the language model's adapters.
"""

from __future__ import annotations

import pytest
import torch
from conftest import cpu_args, message_text, preset_id
from datasets import Dataset
from PIL import Image
from trl import GRPOConfig, GRPOTrainer

import trl_reasoning as tr
from journeys._helpers import lora_config, step_losses
from trl_reasoning.models.tiny_vlm import save_tiny_vlm
from trl_reasoning.trainer.topk_forward import model_inputs

pytestmark = [pytest.mark.journey, pytest.mark.filterwarnings("ignore::trl_reasoning.DynamicSamplingWarning")]

COLORS = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255), "white": (255, 255, 255)}


@pytest.fixture(scope="module")
def tiny_vlm(tmp_path_factory):
    return save_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm"))


def image_prompts(n: int = 16) -> Dataset:
    rows = []
    for i in range(n):
        color = list(COLORS)[i % 4]
        size = 28 if i % 2 else 56
        rows.append(
            {
                "prompt": [{"role": "user", "content": f"{i}: what color?"}],
                "image": Image.new("RGB", (size, size), COLORS[color]),
                "color": color,
            }
        )
    return Dataset.from_list(rows)


def dense(completions, **kwargs) -> list[float]:
    return [(sum(map(ord, message_text(c))) % 7) / 6 for c in completions]


def binary(completions, **kwargs) -> list[float]:
    return [float(len(message_text(c)) % 3 == 0) for c in completions]


def sparse(completions, **kwargs) -> list[float]:
    """Rare successes: DAPO's dynamic sampling has to generate extra rounds (whose rows carry their own images)."""
    return [float(message_text(c).count("a") >= 1) for c in completions]


VLM_ARGS = dict(max_steps=2, per_device_train_batch_size=4, num_generations=2, max_completion_length=6)

#: The presets trained on a binary reward here (MaxRL's estimator needs one; ScaleRL's no-positive-resampling reads a
#: pass rate from it); every other preset, a new one included, gets the dense one.
BINARY_REWARD = ("maxrl", "scalerl")
CASES = {
    "ReasoningTrainer": (tr.ReasoningTrainer, {}, dense),
    **{
        preset_id(entry): (entry.trainer_class, {}, binary if entry.name in BINARY_REWARD else dense)
        for entry in tr.PRESETS
    },
    "DAPO-extra-rounds": (tr.DAPOTrainer, {"max_num_gen_batches": 6}, sparse),
    "DPPO-topk": (tr.DPPOTrainer, {"dppo_divergence": "topk_tv"}, dense),
}


def _train(trainer_cls, config_cls, tiny_vlm, output_dir, reward, peft=None, **overrides):
    path, processor = tiny_vlm
    args = config_cls(**cpu_args(output_dir=str(output_dir), **{**VLM_ARGS, **overrides}))
    trainer = trainer_cls(
        model=str(path),
        reward_funcs=reward,
        args=args,
        train_dataset=image_prompts(),
        processing_class=processor,
        peft_config=peft,
    )
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    moved = {n for n, p in trainer.model.named_parameters() if n in before and not torch.equal(p, before[n])}
    return trainer, moved


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_every_trainer_trains_on_image_prompts_as_grpo_trainer_does(name, tiny_vlm, tmp_path):
    trainer_cls, overrides, reward = CASES[name]
    trainer, moved = _train(trainer_cls, trainer_cls.config_class, tiny_vlm, tmp_path / name, reward, **overrides)
    losses = step_losses(trainer)
    assert sorted(losses) == [1, 2] and all(torch.isfinite(torch.tensor(v)) for v in losses.values())
    assert any("visual" in n for n in moved) and any("language_model" in n for n in moved), sorted(moved)[:5]
    if name == "DAPO-extra-rounds":
        rounds = [entry["group_selection/generation_rounds"] for entry in trainer.state.log_history if "loss" in entry]
        assert max(rounds) > 1, "no extra round: the regrouping of image rows was not exercised"


@pytest.mark.slow
def test_the_base_trainer_equals_grpo_trainer_on_image_prompts(tiny_vlm, tmp_path):
    torch.manual_seed(0)
    ours, _ = _train(tr.ReasoningTrainer, tr.ReasoningConfig, tiny_vlm, tmp_path / "ours", dense)
    torch.manual_seed(0)
    theirs, _ = _train(GRPOTrainer, GRPOConfig, tiny_vlm, tmp_path / "trl", dense)
    assert step_losses(ours) == pytest.approx(step_losses(theirs), rel=1e-5, abs=1e-7)
    for a, b in zip(ours.model.parameters(), theirs.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_lora_on_the_language_model_of_a_vlm(tiny_vlm, tmp_path):
    peft = lora_config()
    trainer, moved = _train(tr.DAPOTrainer, tr.DAPOConfig, tiny_vlm, tmp_path / "lora", dense, peft=peft)
    assert moved and all("lora" in n for n in moved)


def test_regrouped_image_rows_keep_their_own_images(tiny_vlm, tmp_path):
    """The rows dynamic sampling picks from several rounds are scored with their own images: per-token log-probs of
    the regrouped batch equal those of each row computed from the round that generated it."""
    path, processor = tiny_vlm
    args = tr.DAPOConfig(**cpu_args(output_dir=str(tmp_path), **VLM_ARGS, max_num_gen_batches=6))
    trainer = tr.DAPOTrainer(
        model=str(path), reward_funcs=sparse, args=args, train_dataset=image_prompts(), processing_class=processor
    )
    rounds = []
    score_round = trainer.rollout.score_round

    def keep_rounds(inputs, mode):
        scored = score_round(inputs, mode)
        rounds.append({key: value for key, value in scored.rows.items()})
        return scored

    trainer.rollout.score_round = keep_rounds
    trainer.model.train()
    dataset = image_prompts()
    torch.manual_seed(3)
    batch = trainer._generate_and_score_completions([dataset[i] for i in (0, 0, 1, 1)])
    assert len(rounds) > 1, "one round only: nothing was regrouped"
    assert batch["pixel_values"].shape[0] == int(batch["image_grid_thw"].prod(-1).sum())
    assert len(batch["num_images"]) == batch["prompt_ids"].shape[0]

    def logps(rows):
        input_ids = torch.cat([rows["prompt_ids"], rows["completion_ids"]], dim=1)
        mask = torch.cat([rows["prompt_mask"], rows["completion_mask"]], dim=1)
        with torch.no_grad():
            out, _, _ = trainer._get_per_token_logps_and_entropies(
                trainer.model,
                input_ids,
                mask,
                rows["completion_ids"].shape[1],
                **model_inputs(rows),
                num_images=rows["num_images"],
            )
        return out * rows["completion_mask"]

    regrouped = logps(batch)
    for row in range(batch["prompt_ids"].shape[0]):
        completion = batch["completion_ids"][row][batch["completion_mask"][row].bool()]
        matches = []
        for scored in rounds:
            for source in range(scored["completion_ids"].shape[0]):
                if torch.equal(
                    scored["completion_ids"][source][scored["completion_mask"][source].bool()], completion
                ) and (
                    scored["prompt_ids"][source][scored["prompt_mask"][source].bool()].tolist()
                    == batch["prompt_ids"][row][batch["prompt_mask"][row].bool()].tolist()
                ):
                    one = {key: value for key, value in scored.items()}
                    original = logps(one)[source][scored["completion_mask"][source].bool()]
                    matches.append(
                        torch.allclose(original, regrouped[row][batch["completion_mask"][row].bool()], atol=1e-5)
                    )
        assert matches and any(matches), f"row {row} is not scored with its own image"


def _resume_from_checkpoint_2(trainer_cls, config_cls, tiny_vlm, run, reward, **overrides):
    path, processor = tiny_vlm
    settings = {**VLM_ARGS, "max_steps": 3, "save_strategy": "steps", "save_steps": 2, **overrides}
    first = trainer_cls(
        model=str(path),
        reward_funcs=reward,
        args=config_cls(**cpu_args(output_dir=str(run), **settings)),
        train_dataset=image_prompts(),
        processing_class=processor,
    )
    torch.manual_seed(0)
    first.train()
    resumed = trainer_cls(
        model=str(path),
        reward_funcs=reward,
        args=config_cls(**cpu_args(output_dir=str(run), **settings)),
        train_dataset=image_prompts(),
        processing_class=processor,
    )
    resumed.train(resume_from_checkpoint=str(run / "checkpoint-2"))
    return first, resumed


@pytest.mark.slow
def test_a_run_on_image_prompts_resumes_from_a_checkpoint_as_grpo_trainer_does(tiny_vlm, tmp_path):
    """Past a checkpoint and back: the resumed run reaches the end, and lands exactly where GRPOTrainer's resumed run
    lands. (TRL 1.16 itself does not resume a Qwen2-VL run to its uninterrupted result: the third step samples other
    completions after the resume, with text-only models it does; the base trainer reproduces TRL, number for
    number.)"""
    _, ours = _resume_from_checkpoint_2(tr.ReasoningTrainer, tr.ReasoningConfig, tiny_vlm, tmp_path / "ours", dense)
    _, theirs = _resume_from_checkpoint_2(GRPOTrainer, GRPOConfig, tiny_vlm, tmp_path / "trl", dense)
    assert ours.state.global_step == theirs.state.global_step == 3
    assert step_losses(ours)[3] == pytest.approx(step_losses(theirs)[3], rel=1e-5, abs=1e-7)
    for a, b in zip(ours.model.parameters(), theirs.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # DAPO with extra rounds (regrouped image rows in the checkpointed state) resumes and trains to the end too.
    _, dapo = _resume_from_checkpoint_2(
        tr.DAPOTrainer, tr.DAPOConfig, tiny_vlm, tmp_path / "dapo", sparse, max_num_gen_batches=6
    )
    assert dapo.state.global_step == 3 and all(torch.isfinite(torch.tensor(v)) for v in step_losses(dapo).values())


@pytest.fixture(scope="module")
def tied_vlm(tmp_path_factory):
    return save_tiny_vlm(tmp_path_factory.mktemp("tied-vlm"), tie_word_embeddings=True)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["CISPO", "ScaleRL"])
def test_the_fp32_lm_head_presets_train_a_vlm_with_tied_embeddings(name, tied_vlm, tmp_path):
    """CISPO and ScaleRL cast the LM head to float32 by default. TRL's cast reaches for `model.model.embed_tokens`,
    which a VLM does not have (`'Qwen2VLModel' object has no attribute 'embed_tokens'`, with GRPOTrainer too); the
    package casts through get_input_embeddings/get_output_embeddings instead."""
    trainer_cls, _, reward = CASES[name]
    trainer, moved = _train(trainer_cls, trainer_cls.config_class, tied_vlm, tmp_path / name, reward)
    head = trainer.model.get_output_embeddings()
    assert trainer.args.cast_lm_head_to_fp32 and head.weight.dtype == torch.float32
    assert head.weight is trainer.model.get_input_embeddings().weight  # still tied
    assert trainer.state.global_step == 2 and moved


def test_async_rollouts_on_a_vlm_sampled_by_generate_are_refused_or_synchronous(tiny_vlm, tmp_path):
    """The sampler's log-probs of an image prompt are not recorded by `generate`: `async_rollouts=True` is refused
    with the way out; ScaleRL's default (`None`: where the run supports it) trains synchronously with a warning."""
    path, processor = tiny_vlm
    build = dict(model=str(path), reward_funcs=dense, train_dataset=image_prompts(8), processing_class=processor)
    with pytest.raises(ValueError, match="async_rollouts=True: .*vision-language model.*use_vllm"):
        tr.DAPOTrainer(args=tr.DAPOConfig(**cpu_args(output_dir=str(tmp_path / "a"), async_rollouts=True)), **build)
    with pytest.warns(UserWarning, match="trains synchronously"):
        trainer = tr.ScaleRLTrainer(args=tr.ScaleRLConfig(**cpu_args(output_dir=str(tmp_path / "b"))), **build)
    assert trainer.async_rollouts is None
