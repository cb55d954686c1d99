"""``padding_free``: every forward of a step on the real tokens only, with the log-probs, losses and gradients of TRL's
padded forwards (at most 1e-5 apart in float32) on every preset and objective, LoRA and QLoRA, the no-grad forwards
in token-budget groups, token-balanced micro-batches, asynchronous rollouts under each generator and ratio anchor,
truncated-support scoring and bfloat16; where it cannot be exact (a vision-language model, no rotary position
embeddings) it is off by default and refused when asked for. Two processes, DeepSpeed and FSDP:
``tests/trainer/test_split_invariance.py`` and ``tests/journeys/test_sharded.py``."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest
import torch
from conftest import PRESETS, cpu_args, digit_fraction, logged_metric, lora_config, make_prompts
from datasets import Dataset
from torch.utils._pytree import tree_leaves
from transformers import TrainerCallback

import trl_reasoning as tr
from trl_reasoning.algorithms.losses import POLICY_LOSSES
from trl_reasoning.models.packing import PackedRows
from trl_reasoning.models.tiny import save_tiny_model
from trl_reasoning.trainer.padding_free import token_balanced_micro_batches

sys.path.insert(0, str(Path(__file__).parent))
from split_worker import MAX_COMPLETION_LENGTH, rollout  # noqa: E402

#: Parameters after several Adam steps: Adam divides each update by the gradient's running scale, so where a
#: gradient is ~1e-8 a float32 rounding difference of the gradient moves the update by up to ~1e-5 of lr 1e-2.
#: Runs of several steps therefore train with plain SGD, whose updates follow the gradients' own differences.
MULTI_STEP_TOLERANCE = dict(atol=1e-5, rtol=1e-5)
DATASET = Dataset.from_list([{"prompt": [{"role": "user", "content": f"q{i}" * (1 + i % 3)}]} for i in range(8)])


class FirstGradient(TrainerCallback):
    """The flattened gradient of the first optimizer step (before clipping: ``max_grad_norm=0``)."""

    def __init__(self):
        self.gradient = None

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if self.gradient is None:
            self.gradient = torch.cat([p.grad.detach().flatten() for p in model.parameters() if p.grad is not None])


def one_step(
    model_path, tmp_path, trainer_cls=tr.ReasoningTrainer, config_cls=None, reward=digit_fraction, **overrides
):
    """One optimizer step on the split worker's replayed completions (ragged, some truncated): the trainer, its
    first gradient and its logged losses."""
    config_cls = config_cls or trainer_cls.config_class
    peft_config = overrides.pop("peft_config", None)
    capture = FirstGradient()
    settings = dict(per_device_train_batch_size=8, max_completion_length=MAX_COMPLETION_LENGTH, max_steps=1)
    settings |= dict(max_grad_norm=0.0) | overrides
    args = config_cls(**cpu_args(output_dir=str(tmp_path), **settings))
    trainer = trainer_cls(
        model=model_path,
        reward_funcs=reward,
        args=args,
        train_dataset=DATASET,
        rollout_func=rollout,
        callbacks=[capture],
        peft_config=peft_config,
    )
    trainer.train()
    return trainer, capture.gradient, logged_metric(trainer, "loss")


def assert_same_training(padded, packed, what: str, tolerance: float = 1e-5):
    (_, padded_gradient, padded_losses), (trainer, packed_gradient, packed_losses) = padded, packed
    assert trainer.packing.enabled, f"{what}: the packed run did not pack"
    assert padded_gradient.abs().sum() > 0, f"{what}: zero gradient, the comparison would be vacuous"
    error = ((packed_gradient - padded_gradient).norm() / padded_gradient.norm()).item()
    assert error < tolerance, f"{what}: relative gradient difference {error:.2e}"
    assert packed_losses == pytest.approx(padded_losses, rel=1e-5, abs=1e-7), what


def compare(model_path, tmp_path, what: str, tolerance: float = 1e-5, **settings):
    padded = one_step(model_path, tmp_path / "padded", padding_free=False, **settings)
    packed = one_step(model_path, tmp_path / "packed", **settings)
    assert not padded[0].packing.enabled
    assert_same_training(padded, packed, what, tolerance)
    return padded, packed


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_trains_as_with_padded_forwards(name, tiny_model_path, tmp_path):
    trainer_cls, config_cls, reward = PRESETS[name]
    compare(tiny_model_path, tmp_path, name, trainer_cls=trainer_cls, config_cls=config_cls, reward=reward)


#: Settings a loss needs beside its name (a CISPO/VESPO cap as TRL's recommendation).
_LOSS_SETTINGS = {"cispo": {"epsilon_high": 5.0}}


@pytest.mark.parametrize("policy_loss", POLICY_LOSSES.names())
def test_every_policy_loss_trains_as_with_padded_forwards(policy_loss, tiny_model_path, tmp_path):
    compare(tiny_model_path, tmp_path, policy_loss, policy_loss=policy_loss, **_LOSS_SETTINGS.get(policy_loss, {}))


@pytest.mark.parametrize(
    "settings",
    [
        dict(dppo_divergence="binary_kl"),
        dict(dppo_divergence="topk_tv", dppo_topk=4),
        dict(dppo_divergence="topk_kl", dppo_topk=4),
    ],
    ids=["binary_kl", "topk_tv", "topk_kl"],
)
def test_dppo_divergences_train_as_with_padded_forwards(settings, tiny_model_path, tmp_path):
    """DPPO's top-K: the rollout top-K forward and the loss's top-K forward both packed."""
    compare(tiny_model_path, tmp_path, str(settings), trainer_cls=tr.DPPOTrainer, **settings)


@pytest.mark.parametrize(
    "settings",
    [
        dict(beta=0.05),  # TRL's k3 KL against a separate reference model
        dict(advantage_estimator="reinforce_pp_baseline", beta=0.05),  # per-token returns with the KL folded in
        dict(beta=0.05, kl_in_reward=True, policy_loss="sequence_clip", loss_aggregation="seq_mean_token_sum"),
        dict(importance_sampling_level="sequence"),  # GSPO's sequence ratio
        dict(top_k=5, truncated_support_scoring=True),  # every policy scored on the sampler's truncated support
        dict(gradient_accumulation_steps=2, steps_per_generation=2, num_iterations=2),  # pi_old's own forward
        dict(**{"activation_checkpointing": True}),  # the packed attention recomputed in backward
    ],
    ids=[
        "reference",
        "reinforce_pp",
        "kl-in-reward",
        "sequence-ratio",
        "truncated-support",
        "pi-old",
        "checkpointing",
    ],
)
def test_every_forward_of_a_step_is_packed_exactly(settings, tiny_model_path, tmp_path):
    compare(tiny_model_path, tmp_path, str(settings), **settings)


def test_lora_trains_as_with_padded_forwards(tiny_model_path, tmp_path):
    """The adapters' gradient, and the reference as the base model with the adapter disabled (``beta > 0``)."""
    compare(tiny_model_path, tmp_path, "LoRA", beta=0.05, peft_config=lora_config())


def test_qlora_trains_as_with_padded_forwards(tiny_model_path, tmp_path):
    pytest.importorskip("bitsandbytes")
    from transformers import BitsAndBytesConfig

    quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.float32)
    init = {"quantization_config": quantization, "device_map": {"": "cpu"}}
    compare(tiny_model_path, tmp_path, "QLoRA", model_init_kwargs=init, peft_config=lora_config())


def test_a_prorl_reference_reset_trains_as_with_padded_forwards(tiny_model_path, tmp_path):
    """ProRL's reset (reference := policy, fresh optimizer state) at step 2 of 3, with the KL in the loss."""
    runs = {}
    for padding_free in (False, None):
        args = tr.ProRLConfig(
            **cpu_args(output_dir=str(tmp_path / str(padding_free)), max_steps=3, max_completion_length=12),
            reference_reset_steps=2,
            steps_per_generation=1,
            optim="sgd",
            padding_free=padding_free,
        )
        trainer = tr.ProRLTrainer(
            model=tiny_model_path, reward_funcs=digit_fraction, args=args, train_dataset=DATASET, rollout_func=rollout
        )
        trainer.train()
        runs[padding_free] = (logged_metric(trainer, "kl"), dict(trainer.model.named_parameters()))
    assert logged_metric(trainer, "reference/resets")[-1] >= 1
    assert runs[None][0] == pytest.approx(runs[False][0], rel=1e-4, abs=1e-7)
    for name, param in runs[False][1].items():
        torch.testing.assert_close(runs[None][1][name], param, **MULTI_STEP_TOLERANCE)


# ------------------------------------------------------------------------------ the no-grad forwards in groups


def _scored_batch(trainer):
    dataset = make_prompts(8)
    batch = [dataset[i] for i in range(2) for _ in range(4)]
    trainer.model.train()
    torch.manual_seed(0)
    return trainer._generate_and_score_completions(batch)


@pytest.mark.parametrize("budget", [None, 1, 40])
def test_no_grad_forwards_pack_up_to_the_token_budget(budget, tiny_model_path, tmp_path):
    """``pi_old``'s (and the reference's) forward in groups of at most ``padding_free_token_budget`` real tokens:
    the same log-probs as TRL's padded row chunks, in as many model calls as the groups."""
    args = tr.ReasoningConfig(
        **cpu_args(output_dir=str(tmp_path), max_completion_length=12), padding_free_token_budget=budget
    )
    trainer = tr.ReasoningTrainer(
        model=tiny_model_path, reward_funcs=digit_fraction, args=args, train_dataset=DATASET, rollout_func=rollout
    )
    output = _scored_batch(trainer)
    ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
    mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
    length = output["completion_ids"].size(1)
    calls = []
    hook = trainer.model.register_forward_hook(lambda module, inputs, output: calls.append(1))
    with torch.no_grad():
        packed = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, length, batch_size=2)[0]
        groups = len(trainer.packing.forward_groups(mask, 2))
        trainer.packing.enabled = False
        padded = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, length, batch_size=2)[0]
    hook.remove()
    assert calls.count(1) == groups + 4  # the packed groups, then TRL's 4 chunks of 2 rows
    lengths = mask.sum(dim=1).tolist()
    limit = budget or 2 * mask.size(1)  # the default: two rows of the padded length, TRL's chunk
    for group in trainer.packing.forward_groups(mask, 2):
        assert len(group) == 1 or sum(lengths[row] for row in group) <= limit
    if budget == 1:
        assert groups == 8  # every row alone
    if budget is None:
        assert groups <= 4  # never more forwards than TRL's row chunks
    completion_mask = output["completion_mask"]
    assert (packed - padded).mul(completion_mask).abs().max() < 1e-5
    assert (packed * (1 - completion_mask)).abs().max() == 0


def test_token_balanced_micro_batches_move_rows_within_an_optimizer_step_only():
    def micro_batch(first_row: int, lengths: list[int]) -> dict:
        rows = len(lengths)
        completion_mask = torch.zeros(rows, 10, dtype=torch.long)
        for row, length in enumerate(lengths):
            completion_mask[row, :length] = 1
        return {
            "prompt_mask": torch.ones(rows, 2, dtype=torch.long),
            "completion_mask": completion_mask,
            "row": torch.arange(first_row, first_row + rows),
            "texts": [f"row {first_row + row}" for row in range(rows)],
            "num_items_in_batch": torch.tensor(99),
            "old_per_token_logps": None,
        }

    batches = [micro_batch(0, [10, 9]), micro_batch(2, [1, 2]), micro_batch(4, [5, 5]), micro_batch(6, [5, 5])]
    balanced = token_balanced_micro_batches(batches, per_step=2)
    assert len(balanced) == 4
    first_step = sorted(row for batch in balanced[:2] for row in batch["row"].tolist())
    assert first_step == [0, 1, 2, 3]  # rows stay in their optimizer step
    tokens = [int(batch["prompt_mask"].sum() + batch["completion_mask"].sum()) for batch in balanced[:2]]
    assert sorted(tokens) == [15, 15]  # was 23 and 7
    for batch in balanced:
        assert batch["texts"] == [f"row {row}" for row in batch["row"].tolist()]  # lists move with their rows
        assert batch["num_items_in_batch"].item() == 99 and batch["old_per_token_logps"] is None
    assert token_balanced_micro_batches(batches, per_step=1) is batches
    not_whole_steps = batches[:3]
    assert token_balanced_micro_batches(not_whole_steps, per_step=2) is not_whole_steps


# ------------------------------------------------------------------------------ asynchronous rollouts


@pytest.mark.parametrize(
    "settings",
    [
        dict(async_generator="inline", ratio_anchor="pi_old"),
        dict(async_generator="inline", ratio_anchor="sampler"),
        dict(async_generator="inline", ratio_anchor="decoupled"),
        dict(async_generator="process", ratio_anchor="decoupled"),
        dict(async_generator="inline", policy_loss="dppo"),
    ],
    ids=["inline-pi_old", "inline-sampler", "inline-decoupled", "process-decoupled", "inline-dppo"],
)
def test_asynchronous_rollouts_train_as_with_padded_forwards(settings, tiny_model_path, tmp_path):
    """The behaviour policy's log-probs (packed on the old weights) and the loss: same losses and parameters after
    three steps at staleness 1."""
    runs = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the process generator's worker runs one thread
    try:
        for padding_free in (False, None):
            args = tr.ReasoningConfig(
                **cpu_args(output_dir=str(tmp_path / str(padding_free)), max_steps=3),
                async_rollouts=True,
                max_staleness=1,
                optim="sgd",
                padding_free=padding_free,
                **settings,
            )
            trainer = tr.ReasoningTrainer(
                model=tiny_model_path, reward_funcs=digit_fraction, args=args, train_dataset=make_prompts()
            )
            trainer.train()
            runs[padding_free] = (logged_metric(trainer, "loss"), dict(trainer.model.named_parameters()))
    finally:
        torch.set_num_threads(threads)
    assert runs[None][0] == pytest.approx(runs[False][0], rel=1e-4, abs=1e-6)
    for name, param in runs[False][1].items():
        torch.testing.assert_close(runs[None][1][name], param, **MULTI_STEP_TOLERANCE)


# ------------------------------------------------------------------------------ where it is off, and why


def test_on_by_default_for_a_rotary_text_model_and_off_when_asked(tiny_model_path, tmp_path):
    trainer, _, _ = one_step(tiny_model_path, tmp_path)
    assert trainer.packing.enabled and trainer.packing.reason is None
    assert trainer.model.config._attn_implementation == "trl_reasoning_packed_sdpa"
    off, _, _ = one_step(tiny_model_path, tmp_path / "off", padding_free=False)
    assert not off.packing.enabled and off.packing.reason == "padding_free=False"
    assert off.model.config._attn_implementation == "sdpa"


def test_a_model_without_rotary_positions_is_padded_by_default_and_refused_when_asked(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    from trl_reasoning.models.tiny import build_tokenizer

    tokenizer = build_tokenizer()
    model = GPT2LMHeadModel(
        GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2, pad_token_id=tokenizer.pad_token_id)
    )
    args = tr.ReasoningConfig(**cpu_args(output_dir=str(tmp_path), max_steps=1, max_completion_length=8))
    trainer = tr.ReasoningTrainer(
        model=model, reward_funcs=digit_fraction, args=args, train_dataset=make_prompts(), processing_class=tokenizer
    )
    assert not trainer.packing.enabled and "rotary position embeddings" in trainer.packing.reason
    trainer.train()  # padded, as TRL
    args = tr.ReasoningConfig(**cpu_args(output_dir=str(tmp_path)), padding_free=True)
    with pytest.raises(ValueError, match=r"padding_free=True cannot pack this run: .*rotary.*padding_free=False"):
        tr.ReasoningTrainer(
            model=model,
            reward_funcs=digit_fraction,
            args=args,
            train_dataset=make_prompts(),
            processing_class=tokenizer,
        )


def test_a_vision_language_model_is_padded_by_default_and_refused_when_asked(tmp_path):
    from PIL import Image

    from trl_reasoning.models.tiny_vlm import save_tiny_vlm

    path, processor = save_tiny_vlm(tmp_path / "vlm")
    dataset = Dataset.from_list(
        [
            {"prompt": [{"role": "user", "content": f"{i}: what color?"}], "image": Image.new("RGB", (28, 28))}
            for i in range(4)
        ]
    )
    args = tr.ReasoningConfig(**cpu_args(output_dir=str(tmp_path / "auto"), max_steps=1, max_completion_length=4))
    trainer = tr.ReasoningTrainer(
        model=str(path), reward_funcs=digit_fraction, args=args, train_dataset=dataset, processing_class=processor
    )
    assert not trainer.packing.enabled and "vision-language" in trainer.packing.reason
    args = tr.ReasoningConfig(**cpu_args(output_dir=str(tmp_path / "on")), padding_free=True)
    with pytest.raises(ValueError, match="padding_free=True cannot pack this run: a vision-language model"):
        tr.ReasoningTrainer(
            model=str(path), reward_funcs=digit_fraction, args=args, train_dataset=dataset, processing_class=processor
        )


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("padding_free", 3, "padding_free must be a bool"),
        ("padding_free_token_budget", 0, "padding_free_token_budget must be a positive integer"),
        ("padding_free_token_budget", 2.5, "padding_free_token_budget must be an int"),
    ],
)
def test_invalid_settings_name_the_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        tr.ReasoningConfig(**cpu_args(), **{field: value})


def test_a_mask_with_holes_is_scored_padded_with_a_warning(tiny_model_path, tmp_path):
    trainer, _, _ = one_step(tiny_model_path, tmp_path)
    ids = torch.randint(3, 50, (2, 8))
    mask = torch.tensor([[1, 1, 0, 1, 1, 1, 1, 0], [0, 1, 1, 1, 1, 1, 0, 0]])
    with pytest.warns(UserWarning, match="padding_free: this batch is scored padded .*row 0 has padding between"):
        layout = trainer.packing.layout(trainer.model, ids, mask, 4)
    assert not isinstance(layout, PackedRows)
    trainer.model.set_attn_implementation("eager")  # changed behind the trainer's back: no packed sequence reads it
    assert not isinstance(trainer.packing.layout(trainer.model, ids, mask[1:].expand(2, -1), 4), PackedRows)


def test_a_saved_model_keeps_its_own_attention_implementation(tiny_model_path, tmp_path):
    trainer, _, _ = one_step(tiny_model_path, tmp_path)
    trainer.save_model(str(tmp_path / "saved"))
    config = (tmp_path / "saved" / "config.json").read_text()
    assert "trl_reasoning" not in config
    from transformers import AutoModelForCausalLM

    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "saved")
    assert reloaded.config._attn_implementation == "sdpa"


# ------------------------------------------------------------------------------ bfloat16 and DPPO's top-K memory


def _bf16_dppo(model_path, tmp_path, divergence, length=48, **overrides):
    def replay(prompts, trainer):
        tokenizer, seen = trainer.processing_class, {}
        prompt_ids, completion_ids = [], []
        for prompt in prompts:
            text = prompt[-1]["content"]
            index = seen.get(text, 0)
            seen[text] = index + 1
            digest = hashlib.sha256(f"{text}|{index}".encode()).digest()
            completion_ids.append([3 + digest[j % 32] % 90 for j in range(8 + digest[0] % (length - 8))])
            rendered = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
            prompt_ids.append(tokenizer.encode(rendered, add_special_tokens=False))
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}

    args = tr.DPPOConfig(
        **cpu_args(
            output_dir=str(tmp_path),
            per_device_train_batch_size=16,
            num_generations=8,
            max_completion_length=length,
            max_steps=1,
        ),
        dppo_divergence=divergence,
        model_init_kwargs={"dtype": torch.bfloat16},
        **overrides,
    )
    return tr.DPPOTrainer(
        model=model_path, reward_funcs=digit_fraction, args=args, train_dataset=make_prompts(), rollout_func=replay
    )


class LargestTensor(torch.utils._python_dispatch.TorchDispatchMode):
    """The largest tensor any op outputs (bytes and shape): what each op allocates, device-independently."""

    def __init__(self):
        super().__init__()
        self.bytes, self.shape = 0, None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor) and tensor.numel() * tensor.element_size() > self.bytes:
                self.bytes, self.shape = tensor.numel() * tensor.element_size(), tuple(tensor.shape)
        return out


@pytest.fixture(scope="module")
def qwen_vocab_model(tmp_path_factory) -> str:
    """The tiny model with Qwen2.5's vocabulary (151,936): its logits cost what a real model's do."""
    return str(save_tiny_model(tmp_path_factory.mktemp("qwen-vocab"), seed=0, vocab_size=151936))


@pytest.mark.slow
def test_dppo_topk_in_bfloat16_builds_no_vocabulary_wide_logits(qwen_vocab_model, tmp_path):
    """In bfloat16 the top-K forward keeps the LM head on the hidden states (the float32 check used to fail there
    and fall back to [B, T, V] logits), and its largest tensor is no larger than binary TV's through TRL's head."""
    largest = {}
    for divergence in ("binary_tv", "topk_tv"):
        trainer = _bf16_dppo(qwen_vocab_model, tmp_path / divergence, divergence)
        assert next(trainer.model.parameters()).dtype == torch.bfloat16
        mode = LargestTensor()
        with mode:
            trainer.train()
        largest[divergence] = mode
        assert trainer.topk_forward.lm_head_from_hidden, f"{divergence}: fell back to the full logits"
    assert largest["topk_tv"].bytes <= largest["binary_tv"].bytes, (
        largest["topk_tv"].shape,
        largest["binary_tv"].shape,
    )


def test_bfloat16_packed_training_matches_padded_at_bfloat16_precision(tiny_model_path, tmp_path):
    init = {"model_init_kwargs": {"dtype": torch.bfloat16}}
    padded = one_step(tiny_model_path, tmp_path / "padded", padding_free=False, **init)
    packed = one_step(tiny_model_path, tmp_path / "packed", **init)
    assert_same_training(padded, packed, "bfloat16", tolerance=0.05)
