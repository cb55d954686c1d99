"""Evidence v4: the papers' claims where a real model can answer differently from the toy, on SmolLM2-135M-Instruct.

Every run starts from the model itself (LoRA r=16 on all linear layers, learning rate 2e-4, constant), trains on one-step
arithmetic (``tasks.arithmetic``: addition, subtraction and multiplication questions, a held-out set of 64 never seen
in training) and stops at the same budget of generated completion tokens (counted in the reward function, so dynamic
sampling's extra rounds count). The held-out set is then measured once per run: greedy accuracy, 8 samples per
question (pass@1, pass@8, the length of correct and incorrect completions). Each run also keeps its compute curve
(the training reward of each generation step against the generated tokens so far), the policy entropy of its last
steps, its clip fraction and, where the loss takes its ratio to the sampler, the mean ``|log(π_θ / μ)|``.

Method (from re-reading v2): each claim compares two arms that differ in **one** setting, everything else equal
(estimator, aggregation, sampling, learning rate, budget); runs are paired by seed (the same seed gives both arms the
same first batch) and the effect is the mean of the per-seed differences with a 95% Student-t interval (a percentile
bootstrap over a handful of seeds under-covers). A direction is called only when the interval excludes 0, and a small
effect only at >= 8 seeds; anything else is reported as not resolved. The table states each interval's half-width:
the smallest effect the seeds could have called. The compute curves get ScaleRL's sigmoid fitted per run, and each
arm's A, B and C_mid a t interval across its seeds.

Claims (arm A vs arm B; the measure; what the paper expects):

* ``maxrl_passk``: estimator ``maxrl`` vs ``grpo`` (clip 0.2, token mean, binary reward); held-out pass@8; MaxRL
  expects higher pass@k.
* ``stale_cispo``: policy loss ``cispo`` (cap 5) vs ``clip`` (0.2/0.28), estimator ``grpo``, token mean, each sample
  used once (``num_iterations=1``) and each generation batch split over 4 optimizer steps
  (``steps_per_generation=4``), so the last step trains on rollouts 3 updates old; held-out pass@1, with each run's
  clip fraction (the share of tokens a clip, cap or mask acts on); CISPO expects to do better than clipping. This is
  not the papers' asynchronous regime; ``async_k8`` is.
* ``dynamic_sampling``: DAPO with dynamic sampling on vs off; held-out pass@1 at the same generated-token budget; DAPO
  expects more accuracy per generated token.
* ``length_bias``: aggregation ``seq_mean_token_mean`` (GRPO's 1/|y|) vs ``seq_mean_token_sum_norm`` (Dr. GRPO),
  estimator ``dr_grpo`` both; the length of incorrect held-out completions (``max_completion_length=32`` leaves room);
  Dr. GRPO expects them longer under 1/|y|.
* ``clip_higher``: ``epsilon_high`` 0.28 vs 0.2 (clip, token mean) with each rollout batch split over 4 optimizer
  steps, as DAPO's mini-batches split it (at one step per batch the ratio is 1 and no clip acts); the policy entropy
  of the last 3 steps and held-out pass@8; DAPO expects both higher.
* ``async_k8``: CISPO (cap 5), DPPO binary TV and DPPO top-K TV, each vs the clip (0.2/0.28), with asynchronous
  rollouts at ``max_staleness=8`` (PipelineRL-8, ScaleRL's regime; each sample used once); held-out pass@1, with the
  clip fraction and the sampler ratio of each arm; CISPO and DPPO expect to do better than clipping.
* ``scalerl_vs_dapo``: the ScaleRL preset vs the DAPO preset, each with its own defaults, at the same generated-token
  budget; held-out pass@1; ScaleRL expects its recipe to do better.
* ``gspo_stale`` and ``gspo_async_k8``: GSPO's sequence ratio and clip (3e-4 / 4e-4) vs its paper's GRPO baseline, the
  token ratio clipped at 0.2 / 0.27, both aggregated as the GSPO preset does, on completions of up to 96 tokens, with
  each rollout batch split over 4 optimizer steps or asynchronous at k = 8; 16 optimizer steps, 4 seeds; held-out
  pass@1; GSPO expects to do better.
* ``reinforce_pp_mixed``: estimator ``reinforce_pp_baseline`` (group mean, then the batch's token statistics) vs
  ``grpo`` (the group's std) on add/sub/mul, beta 0 both; held-out pass@1; REINFORCE++ expects to do better.
* ``prorl_reset``: the reference and optimizer reset every 12 steps vs none, beta 0.01, clip 0.2 / 0.4; 48 optimizer
  steps, 4 seeds; held-out pass@1; ProRL expects the reset to keep the run improving.

Runs take minutes each on a CPU; every finished run is appended to ``bench/evidence_real_runs.json`` at once, and a
later invocation skips the runs already there, so the table fills across sessions:

    python bench/evidence_real.py --claims maxrl_passk stale_cispo --seeds 0 1 2 [--jobs 2] [--budget 4000]
    python bench/evidence_real.py --summarize      # the table, bench/evidence_real.png and evidence_real_curves.png
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import geometric_t_interval, t_interval  # noqa: E402
from _results import read_runs, record, save_run  # noqa: E402

RUNS = Path(__file__).with_name("evidence_real_runs.json")
ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BUDGET = 4000
TEST_QUESTIONS = 64
PLOT = Path(__file__).with_name("evidence_real.png")
DOCS_PLOT = ROOT / "docs" / "images" / "evidence.png"
CURVES_PLOT = Path(__file__).with_name("evidence_real_curves.png")
_RISE_PLACED = 0.1  # a fit whose curve climbs less than this share of A - R0 across the run's own tokens is flat
#: the mean |log(pi_theta / mu)| over the tokens of a step, logged where the loss's ratio is taken to the sampler
_SAMPLER_RATIO = "async/sampler_ratio/abs_log_mean"
_TRL_SAMPLER_DIFFERENCE = "sampling/sampling_logp_difference/mean"  # the same |log pi - log mu|, TRL's correction

_BASE = {"advantage_estimator": "grpo", "loss_aggregation": "token_mean", "dynamic_sampling": False}
_CLIP = {"policy_loss": "clip", "epsilon": 0.2, "epsilon_high": 0.28}
_STALE = {"steps_per_generation": 4, "num_iterations": 1}
#: GSPO's objective with its paper's ranges (§5.1), and that section's GRPO baseline: the token ratio clipped at
#: 0.2 / 0.27; both aggregate as GSPO's preset does (a mean over sequences of token means)
_GSPO = {"policy_loss": "gspo", "epsilon": 3e-4, "epsilon_high": 4e-4}
_GSPO_BASELINE = {"policy_loss": "clip", "epsilon": 0.2, "epsilon_high": 0.27}
_SEQ_MEAN = {"loss_aggregation": "seq_mean_token_mean"}
_LONG = {"max_completion_length": 96}
_CLIP_SYMMETRIC = {"policy_loss": "clip", "epsilon": 0.2, "epsilon_high": 0.2}  # REINFORCE++'s (OpenRLHF eps_clip)
_PRORL_CLIP = {"policy_loss": "clip", "epsilon": 0.2, "epsilon_high": 0.4}  # ProRL's clip-higher
#: PipelineRL-8, ScaleRL's regime: every batch sampled by the weights of 8 optimizer steps earlier, used once (the
#: in-process generator gives the same batches as the worker process, without needing a third core)
_ASYNC_K8 = {"async_rollouts": True, "max_staleness": 8, "async_generator": "inline", "num_iterations": 1}


def _pair(arm_a: str, arm_b: str, measure: str, expects: str, tests: str, paper: bool = True) -> dict:
    """One comparison: arm a − arm b on ``measure``; ``tests`` names the claim it tests (the paper and its baseline);
    ``paper=False`` marks a comparison no paper made (its verdict says which arm is higher, never "reproduces" or
    "opposite"), and ``expects`` is then the direction this package's default assumes."""
    return {"a": arm_a, "b": arm_b, "measure": measure, "expects": expects, "tests": tests, "paper": paper}


#: The k = 8 arms: "clip" is TRL's objective (ratio to pi_old, the learner itself here, with TRL's sequence_mask
#: correction: v4's baseline); "clip_sampler" is the papers' baseline, the clip on pi_theta / mu (the DPPO paper's
#: GRPO, verl's bypass mode); "clip_decoupled" is AReaL's form, the clip family's asynchronous default.
_ASYNC_K8_ARMS = {
    "clip": {**_BASE, **_CLIP, **_ASYNC_K8, "ratio_anchor": "pi_old"},
    "clip_sampler": {**_BASE, **_CLIP, **_ASYNC_K8, "ratio_anchor": "sampler"},
    "clip_decoupled": {**_BASE, **_CLIP, **_ASYNC_K8, "ratio_anchor": "decoupled"},
    "cispo": {**_BASE, "policy_loss": "cispo", "epsilon_high": 5.0, **_ASYNC_K8},
    "dppo_binary": {**_BASE, "policy_loss": "dppo", "dppo_divergence": "binary_tv", **_ASYNC_K8},
    "dppo_topk": {**_BASE, "policy_loss": "dppo", "dppo_divergence": "topk_tv", **_ASYNC_K8},
}
_VS_TRL = "vs TRL's clip on pi_old, not the paper's baseline"
#: The k = 8 comparisons: each loss against the papers' own baseline (the clip on pi_theta / mu: the DPPO paper's GRPO,
#: verl's bypass mode), against TRL's objective (v4's baseline, whose clip never acts there), and the clip's two
#: anchors against each other (no paper's claim: the question behind this package's asynchronous default).
_ASYNC_COMPARISONS = [
    _pair("dppo_binary", "clip_sampler", "pass@1", "higher", "DPPO binary-TV over its baseline, the clip on pi/mu"),
    _pair("dppo_topk", "clip_sampler", "pass@1", "higher", "DPPO top-K TV over its baseline, the clip on pi/mu"),
    # MiniMax-M1 compared CISPO with DAPO's clip on its own (stale minibatch) setting, never with the clip on pi/mu:
    # this is the DPPO paper's baseline, so the row says which arm is higher and claims no reproduction
    _pair(
        "cispo",
        "clip_sampler",
        "pass@1",
        "higher",
        "CISPO vs the clip on pi/mu (DPPO's baseline; no CISPO claim)",
        paper=False,
    ),
    _pair("clip_sampler", "clip", "pass@1", "higher", "the clip's anchor: mu (sampler) vs pi_old", paper=False),
    _pair("clip_decoupled", "clip", "pass@1", "higher", "the clip's anchor: decoupled (AReaL) vs pi_old", paper=False),
    _pair("cispo", "clip", "pass@1", "higher", f"CISPO {_VS_TRL}", paper=False),
    _pair("dppo_binary", "clip", "pass@1", "higher", f"DPPO binary-TV {_VS_TRL}", paper=False),
    _pair("dppo_topk", "clip", "pass@1", "higher", f"DPPO top-K TV {_VS_TRL}", paper=False),
]


#: A claim's budget is generated completion tokens (``--budget``) unless it declares ``"unit": "steps"`` and its own
#: ``"budget"`` of optimizer steps (DAPO's dynamic-sampling claim is in steps; the long trust-region rows need a
#: horizon in steps).
def claim_budget(claim: str, token_budget: int) -> tuple[str, int]:
    """``(unit, budget)`` of ``claim``'s runs: ``("tokens", token_budget)`` or its own ``("steps", n)``."""
    spec = CLAIMS[claim]
    return (spec["unit"], spec["budget"]) if spec.get("unit") == "steps" else ("tokens", token_budget)


#: claim -> its arms (settings over the shared ones; ``"preset"`` names a preset whose config and trainer the arm
#: uses, with the preset's own defaults) and the comparisons it makes (arm a − arm b, the measure, and the direction
#: the paper expects). Arms of one claim share their runs between its comparisons.
CLAIMS: dict[str, dict] = {
    "maxrl_passk": {
        "arms": {
            "maxrl": {**_BASE, **_CLIP, "advantage_estimator": "maxrl"},
            "grpo": {**_BASE, **_CLIP},
        },
        "compare": [_pair("maxrl", "grpo", "pass@8", "higher", "MaxRL: higher pass@k than GRPO")],
    },
    "stale_cispo": {
        "arms": {
            "cispo": {**_BASE, "policy_loss": "cispo", "epsilon_high": 5.0, **_STALE},
            "clip": {**_BASE, **_CLIP, **_STALE},
        },
        "compare": [
            _pair("cispo", "clip", "pass@1", "higher", "CISPO over the clip on stale minibatches (MiniMax-M1)")
        ],
    },
    # at equal generated tokens: more accuracy per token is not what DAPO claims (see dynamic_sampling_steps)
    "dynamic_sampling": {
        "arms": {
            "on": {**_BASE, **_CLIP, "dynamic_sampling": True, "max_num_gen_batches": 4},
            "off": {**_BASE, **_CLIP},
        },
        "compare": [
            _pair(
                "on",
                "off",
                "pass@1",
                "higher",
                "DAPO dynamic sampling: more accuracy per token (not claimed)",
                paper=False,
            )
        ],
    },
    # DAPO's claim (§3.3, Fig. 6): the same accuracy in fewer training steps, so more at equal optimizer steps (17: the
    # steps the arm without it makes on 4,000 tokens)
    "dynamic_sampling_steps": {
        "arms": {
            "on": {**_BASE, **_CLIP, "dynamic_sampling": True, "max_num_gen_batches": 4},
            "off": {**_BASE, **_CLIP},
        },
        "unit": "steps",
        "budget": 17,
        "compare": [_pair("on", "off", "pass@1", "higher", "DAPO: dynamic sampling, more accuracy at equal steps")],
    },
    "length_bias": {
        "arms": {
            "seq_mean_token_mean": {
                **_BASE,
                **_CLIP,
                "advantage_estimator": "dr_grpo",
                "loss_aggregation": "seq_mean_token_mean",
                "max_completion_length": 32,
            },
            "seq_mean_token_sum_norm": {
                **_BASE,
                **_CLIP,
                "advantage_estimator": "dr_grpo",
                "loss_aggregation": "seq_mean_token_sum_norm",
                "max_completion_length": 32,
            },
        },
        "compare": [
            _pair(
                "seq_mean_token_mean",
                "seq_mean_token_sum_norm",
                "incorrect_length",
                "higher",
                "Dr. GRPO: dividing by the length lengthens wrong answers",
            )
        ],
    },
    # DAPO's clip-higher acts only where the ratio leaves 1: DAPO splits each rollout batch into several optimizer
    # steps (its mini-batches), as steps_per_generation=4 does here
    "clip_higher": {
        "arms": {
            "eps_high_0.28": {**_BASE, **_CLIP, **_STALE},
            "eps_high_0.20": {**_BASE, **_CLIP, "epsilon_high": 0.2, **_STALE},
        },
        "compare": [
            _pair("eps_high_0.28", "eps_high_0.20", "entropy_end", "higher", "DAPO: clip-higher keeps entropy"),
            _pair("eps_high_0.28", "eps_high_0.20", "pass@8", "higher", "DAPO: clip-higher keeps diversity"),
        ],
    },
    "async_k8": {
        "arms": _ASYNC_K8_ARMS,
        "compare": _ASYNC_COMPARISONS,
    },
    # the same arms over a horizon where a trust region can pay: 50 optimizer steps (the 4,000-token runs make 17, the
    # first 8 of them sampled by the initial weights)
    "async_k8_long": {
        "arms": _ASYNC_K8_ARMS,
        "unit": "steps",
        "budget": 50,
        "seeds": 4,  # each run is three times as long: the seeds the time allows, at least 4
        "compare": _ASYNC_COMPARISONS[:5],
    },
    # the two recipes as their presets ship them (ScaleRL: CISPO, prompt-mean, batch-scaled advantages, zero-variance
    # filtering, PipelineRL-8; DAPO: clip-higher, token mean, dynamic sampling, soft overlong punishment) at the same
    # generated-token budget
    "scalerl_vs_dapo": {
        "arms": {"scalerl": {"preset": "scalerl"}, "dapo": {"preset": "dapo"}},
        "compare": [_pair("scalerl", "dapo", "pass@1", "higher", "ScaleRL: its recipe over DAPO's at equal compute")],
    },
    # GSPO (§5, Fig. 1): its sequence ratio and sequence clip train better than GRPO's token ratios once the data is
    # off-policy - each rollout batch split over 4 optimizer steps (the paper's minibatches), and PipelineRL-8 - on
    # completions long enough for a sequence ratio to differ from its tokens' (up to 96 tokens: before training
    # SmolLM2 explains before it answers). The paper's unit is training steps; each run is ~6x a 16-token one.
    "gspo_stale": {
        "arms": {
            "gspo": {**_BASE, **_SEQ_MEAN, **_GSPO, **_STALE, **_LONG},
            "grpo": {**_BASE, **_SEQ_MEAN, **_GSPO_BASELINE, **_STALE, **_LONG},
        },
        "unit": "steps",
        "budget": 16,
        "seeds": 4,
        "compare": [_pair("gspo", "grpo", "pass@1", "higher", "GSPO over GRPO's token ratio, minibatched rollouts")],
    },
    "gspo_async_k8": {
        "arms": {
            "gspo": {**_BASE, **_SEQ_MEAN, **_GSPO, **_ASYNC_K8, **_LONG},
            "grpo": {**_BASE, **_SEQ_MEAN, **_GSPO_BASELINE, **_ASYNC_K8, **_LONG},
        },
        "unit": "steps",
        "budget": 16,
        "seeds": 4,
        # neither clip acts here (one optimizer step a batch: the decoupled anchor's proximal policy is the learner),
        # so the row tests how the staleness weights reach the gradient, not GSPO's sequence clip
        "compare": [
            _pair(
                "gspo",
                "grpo",
                "pass@1",
                "higher",
                "GSPO's sequence weights vs GRPO's token ones, k = 8 (no clip acts)",
            )
        ],
    },
    # REINFORCE++-baseline (Hu et al.): the group mean subtracted, then normalised over the batch's tokens, against
    # GRPO's per-group std, on add/sub/mul (easy additions beside hard products: where group and batch scaling
    # differ). One change, the estimator; beta 0 in both, so the KL in the return is not part of the comparison.
    "reinforce_pp_mixed": {
        "arms": {
            "reinforce_pp_baseline": {**_BASE, **_CLIP_SYMMETRIC, "advantage_estimator": "reinforce_pp_baseline"},
            "grpo": {**_BASE, **_CLIP_SYMMETRIC},
        },
        "compare": [
            _pair(
                "reinforce_pp_baseline",
                "grpo",
                "pass@1",
                "higher",
                "REINFORCE++-baseline's estimator over GRPO's (beta 0)",
            )
        ],
    },
    # ProRL (§2.2): the reference and the optimizer reset keep a KL-regularised run improving. One change, the reset
    # (every 12 steps, 3 resets in 48); beta 0.01, not the paper's 1e-4, which does not bind in 48 steps of LoRA on a
    # 135M model: this tests the mechanism at a horizon where the KL can hold the policy back, not ProRL's thousands
    # of steps.
    "prorl_reset": {
        "arms": {
            "reset": {**_BASE, **_PRORL_CLIP, "beta": 0.01, "reference_reset_steps": 12},
            "no_reset": {**_BASE, **_PRORL_CLIP, "beta": 0.01},
        },
        "unit": "steps",
        "budget": 48,
        "seeds": 4,
        # ProRL resets by hand between runs and reports no reset-vs-none ablation: no paper's claim, beta 0.01
        "compare": [
            _pair(
                "reset",
                "no_reset",
                "pass@1",
                "higher",
                "reference reset vs none at beta 0.01 (no ProRL ablation)",
                paper=False,
            )
        ],
    },
}


def _key(claim: str, arm: str, seed: int, budget: int) -> str:
    return f"{claim}/{arm}/{seed}/{budget}"


def _run_settings(job: dict, cpu_settings: dict) -> dict:
    """The config values every arm shares (the real model's measured CPU settings; the token budget, not
    ``max_steps``, ends a run), before the arm's own."""
    settings = {
        **cpu_settings,
        "output_dir": job["output_dir"],
        "per_device_train_batch_size": 16,
        "num_generations": 8,
        "max_completion_length": 16,
        "learning_rate": 2e-4,
        "lr_scheduler_type": "constant",
        "max_steps": 10_000,  # the token budget stops the run
        "logging_steps": 1,
        "temperature": 1.0,
        "top_k": 0,
        "seed": job["seed"],
        "log_level": "error",
    }
    return settings


def _clipped_fractions(history: list[dict]) -> list[float]:
    """Per logged step, the fraction of tokens the arm's objective clips, caps or masks: DPPO's masked fractions
    (both signs), the clip's two-sided region, or CISPO's capped tokens."""
    clipped = []
    for entry in history:
        if "dppo/masked_frac_pos_adv" in entry:
            clipped.append(entry["dppo/masked_frac_pos_adv"] + entry.get("dppo/masked_frac_neg_adv", 0.0))
        elif "clip_ratio/region_mean" in entry or "clip_ratio/high_mean" in entry:
            clipped.append(entry.get("clip_ratio/region_mean", entry.get("clip_ratio/high_mean")))
    return clipped


def _sampler_log_ratios(history: list[dict]) -> list[float]:
    """Per logged step, the mean ``|log(pi / mu)|`` over the loss tokens: the package's own metric for losses whose
    ratio is against the sampler (CISPO, DPPO), TRL's ``sampling_logp_difference`` (``pi_old`` against ``mu``) for
    the losses that use TRL's correction (the clip), so every off-policy arm has the column."""
    return [
        entry[_SAMPLER_RATIO] if _SAMPLER_RATIO in entry else entry[_TRL_SAMPLER_DIFFERENCE]
        for entry in history
        if _SAMPLER_RATIO in entry or _TRL_SAMPLER_DIFFERENCE in entry
    ]


def _effective_sample_sizes(history: list[dict]) -> list[float]:
    """Per logged step, the normalised effective sample size of the off-policy weights: TRL's correction weights
    (``sampling/effective_sample_size``), or for a loss whose ratio is the sampler's, of ``pi_theta / mu`` per token,
    ``mean(w)^2 / mean(w^2)``."""
    sizes = []
    for entry in history:
        if "sampling/effective_sample_size" in entry:
            sizes.append(entry["sampling/effective_sample_size"])
        elif entry.get("async/sampler_ratio/sq_mean"):
            sizes.append(entry["async/sampler_ratio/mean"] ** 2 / entry["async/sampler_ratio/sq_mean"])
    return sizes


def _trainer_within_budget(job: dict, trainer_class, args, path, tokenizer, task, reward, tokens: dict):
    """The LoRA trainer of one run, stopped at the step where the generated tokens reach ``job["budget"]``."""
    import transformers
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, TrainerCallback

    trainer = trainer_class(
        model=AutoModelForCausalLM.from_pretrained(path),
        reward_funcs=reward,
        args=args,
        train_dataset=Dataset.from_list(task.rl_rows("train")),
        processing_class=tokenizer,
        peft_config=LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM"),
    )
    trainer.remove_callback(transformers.PrinterCallback)

    class Budget(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            # a budget in steps is max_steps (set by run_one); a budget in tokens stops here
            if job.get("unit", "tokens") == "tokens" and tokens["generated"] >= job["budget"]:
                control.should_training_stop = True

        def on_log(self, args, state, control, logs=None, **kwargs):
            # the compute curve: the training reward against the generated tokens so far (generation steps only)
            if logs and "reward" in logs:
                tokens["curve"].append([tokens["generated"], logs["reward"]])

    trainer.add_callback(Budget())
    return trainer


def _preset_trainer(name: str | None):
    """The trainer class of the preset ``name`` (its config class is ``config_class``); ReasoningTrainer for None."""
    from trl_reasoning import ReasoningTrainer
    from trl_reasoning.presets import PRESETS

    if name is None:
        return ReasoningTrainer
    return next(preset.trainer_class for preset in PRESETS if preset.name == name)


def run_one(job: dict) -> dict:
    """One training run and its held-out measurement (in a fresh process, see ``main``'s ``--worker``)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import datasets
    import torch
    import transformers

    from trl_reasoning.models.loading import load_tokenizer
    from trl_reasoning.models.pretrained import smollm2_path
    from trl_reasoning.models.tiny import cpu_config_kwargs
    from trl_reasoning.tasks.arithmetic import ArithmeticTask, last_number, last_number_reward

    datasets.disable_progress_bars()
    transformers.utils.logging.set_verbosity_error()
    torch.set_num_threads(1)
    path = smollm2_path()
    task = ArithmeticTask(kinds=("add", "sub", "mul"), num_train=2048, num_test=TEST_QUESTIONS, seed=0)
    tokens = {"generated": 0, "curve": []}

    def reward(completions, answer, completion_ids=None, **kwargs):
        tokens["generated"] += sum(len(ids) for ids in completion_ids)
        return last_number_reward(completions, answer)

    reward.__name__ = "last_number_reward"
    arm = dict(CLAIMS[job["claim"]]["arms"][job["arm"]])
    trainer_class = _preset_trainer(arm.pop("preset", None))
    settings = _run_settings(job, cpu_config_kwargs())
    if job.get("unit") == "steps":
        settings["max_steps"] = job["budget"]
    args = trainer_class.config_class(**{**settings, **arm})
    tokenizer = load_tokenizer(path)
    trainer = _trainer_within_budget(job, trainer_class, args, path, tokenizer, task, reward, tokens)
    started = time.perf_counter()
    trainer.train()
    train_seconds = time.perf_counter() - started
    measures = held_out_measures(
        trainer.model, tokenizer, task.rl_rows("test"), args.max_completion_length, last_number
    )
    return _run_record(job, trainer, tokens, measures, train_seconds)


def _run_record(job: dict, trainer, tokens: dict, measures: dict, train_seconds: float) -> dict:
    """What one run records: its held-out measures and, from its logged steps, the off-policy metrics (the clip
    fraction, TRL's changed-weight share, the ESS, the sampler ratio), the entropy at the end and its compute curve."""
    history = [entry for entry in trainer.state.log_history if "loss" in entry]
    clipped = _clipped_fractions(history)
    rewards = [entry["reward"] for entry in history if "reward" in entry]
    entropies = [entry["entropy"] for entry in history if "entropy" in entry]
    sampler = _sampler_log_ratios(history)
    # the share of importance weights TRL's correction truncated or masked (sequence_mask by default: whole sequences)
    changed = [entry["async/is_weight_changed"] for entry in history if "async/is_weight_changed" in entry]
    ess = _effective_sample_sizes(history)
    kls = [entry["kl"] for entry in history if "kl" in entry]
    resets = [entry["reference/resets"] for entry in history if "reference/resets" in entry]
    return {
        **job,
        "steps": trainer.state.global_step,
        "generated_tokens": tokens["generated"],
        "train_seconds": train_seconds,
        **measures,
        "clip_fraction": statistics.fmean(clipped) if clipped else float("nan"),
        # the reward is logged at generation steps only (every steps_per_generation steps in the stale regime)
        "train_reward_last": statistics.fmean(rewards[-5:]) if rewards else float("nan"),
        "entropy_end": statistics.fmean(entropies[-3:]) if entropies else float("nan"),
        "sampler_ratio_abs_log": statistics.fmean(sampler) if sampler else float("nan"),
        "is_weight_changed": statistics.fmean(changed) if changed else float("nan"),
        "ess": statistics.fmean(ess) if ess else float("nan"),
        # the KL to the reference (a run with beta != 0) and the reference resets it made (ProRL's reset)
        "kl_mean": statistics.fmean(kls) if kls else float("nan"),
        "reference_resets": max(resets) if resets else 0,
        "curve": tokens["curve"],
        "load": os.getloadavg()[0],
    }


def held_out_measures(model, tokenizer, rows: list[dict], max_new_tokens: int, last_number, samples: int = 8) -> dict:
    """One greedy reply and ``samples`` sampled replies (temperature 1, a fixed seed) per held-out question: greedy
    accuracy, unbiased pass@1 and pass@``samples``, and the mean length (tokens, EOS included) of all, correct and
    incorrect sampled replies."""
    import torch

    from trl_reasoning.evaluation.callbacks import _prompt_texts, _sample
    from trl_reasoning.evaluation.pass_at_k import mean_pass_at_k

    generation = {
        "max_new_tokens": max_new_tokens,
        "temperature": 1.0,
        "top_k": 0,
        "pad_token_id": tokenizer.pad_token_id,
    }
    greedy, counts, correct, incorrect = [], [], [], []
    torch.manual_seed(1234)
    was_training, padding_side = model.training, tokenizer.padding_side
    model.eval()
    tokenizer.padding_side = "left"
    try:
        for start in range(0, len(rows), 8):
            chunk = rows[start : start + 8]
            texts = _prompt_texts(tokenizer, [r["prompt"] for r in chunk])
            answers = [r["answer"] for r in chunk]
            greedy += [
                last_number(t) == a
                for t, a in zip(_sample(model, tokenizer, texts, 1, True, generation)["texts"], answers)
            ]
            sampled = _sample(model, tokenizer, texts, samples, False, generation)
            for index, answer in enumerate(answers):
                block = slice(index * samples, (index + 1) * samples)
                right = [last_number(t) == answer for t in sampled["texts"][block]]
                counts.append(sum(right))
                for ok, length in zip(right, sampled["lengths"][block], strict=True):
                    (correct if ok else incorrect).append(length)
    finally:
        tokenizer.padding_side = padding_side
        model.train(was_training)
    mean = lambda values: statistics.fmean(values) if values else float("nan")  # noqa: E731
    return {
        "accuracy": mean([float(g) for g in greedy]),
        "pass@1": mean_pass_at_k(counts, samples, 1),
        f"pass@{samples}": mean_pass_at_k(counts, samples, samples),
        "mean_length": mean(correct + incorrect),
        "correct_length": mean(correct),
        "incorrect_length": mean(incorrect),
    }


def _launch(job: dict) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        job = {**job, "output_dir": os.path.join(tmp, "run")}
        out = os.path.join(tmp, "result.json")
        command = [sys.executable, __file__, "--worker", json.dumps(job), "--out", out]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"{job} failed:\n{result.stderr[-4000:]}")
        return json.loads(Path(out).read_text())


def collect(options) -> None:
    jobs = []
    recorded = read_runs(RUNS)
    for seed in options.seeds:
        for claim in options.claims:
            unit, budget = claim_budget(claim, options.budget)
            for arm in CLAIMS[claim]["arms"]:
                key = _key(claim, arm, seed, budget)
                if key not in recorded:
                    job = {"claim": claim, "arm": arm, "seed": seed, "budget": budget, "unit": unit, "key": key}
                    jobs.append(job)
    print(f"{len(jobs)} runs to do ({len(recorded)} recorded)", flush=True)

    def go(job: dict) -> None:
        if job["key"] in read_runs(RUNS):  # another invocation recorded it meanwhile
            return
        started = time.time()
        result = _launch(job)
        result["wall_s"] = time.time() - started
        save_run(RUNS, job["key"], result)  # re-reads the file: another worker may have written meanwhile
        measures = sorted({pair["measure"] for pair in CLAIMS[job["claim"]]["compare"]})
        shown = ", ".join(f"{measure} {result[measure]:.3f}" for measure in measures)
        print(f"{job['key']}: {shown} ({result['steps']} steps, {result['wall_s']:.0f} s)", flush=True)

    with ThreadPoolExecutor(max_workers=options.jobs) as pool:
        for future in [pool.submit(go, job) for job in jobs]:
            future.result()


def _paired_runs(runs: dict, claim: str, budget: int) -> dict[int, dict[str, dict]]:
    """seed -> arm -> run, for one claim's runs at one budget."""
    by_seed: dict[int, dict[str, dict]] = {}
    for run in runs.values():
        if run["claim"] == claim and run["budget"] == budget:
            by_seed.setdefault(run["seed"], {})[run["arm"]] = run
    return by_seed


def verdict(differences: list[float], expects: str, paper: bool = True) -> tuple[str, float, float, float]:
    """The rule, fixed before the runs: a direction is called only when the 95% t interval of the per-seed differences
    excludes 0 ("reproduces" when it is the paper's, "opposite" otherwise; "A higher" / "A lower" for a comparison no
    paper made), and is qualified below 8 seeds; anything else is "not resolved". Returns the verdict, the mean and
    the interval (its half-width is the smallest effect these seeds could have called)."""
    mean, low, high = t_interval(differences)
    if len(differences) < 3 or not (low > 0 or high < 0):
        return "not resolved" + (" (fewer than 3 seeds)" if len(differences) < 3 else ""), mean, low, high
    direction = "higher" if low > 0 else "lower"
    suffix = "" if len(differences) >= 8 else f" at {len(differences)} seeds (a small effect needs >= 8)"
    if not paper:  # no paper made this comparison: only which arm is higher
        return f"A {direction}" + suffix, mean, low, high
    return ("reproduces" if direction == expects else "opposite") + suffix, mean, low, high


def _effect_text(mean: float, low: float, high: float) -> str:
    """``+0.129 [+0.085, +0.172]``; with fewer than two seeds there is no interval, and the text says so."""
    if low != low or high != high:
        return f"{mean:+.3f} (no interval: one seed)"
    return f"{mean:+.3f} [{low:+.3f}, {high:+.3f}]"


def _half_width(low: float, high: float) -> str:
    """The interval's half-width, the smallest effect the seeds could call; "–" without an interval."""
    return f"{(high - low) / 2:.3f}" if low == low and high == high else "–"


def _mean_of(paired: list[tuple[dict, dict]], side: int, key: str, digits: int) -> str:
    values = [pair[side].get(key, float("nan")) for pair in paired]
    values = [v for v in values if v == v]
    return f"{statistics.fmean(values):.{digits}f}" if values else "–"


def _unit_text(claim: str, budget: int) -> str:
    unit, claim_units = claim_budget(claim, budget)
    return f"{claim_units} {unit}"


def comparisons(runs: dict, budget: int) -> list[dict]:
    """Every comparison with recorded pairs: its claim, arms, measure, unit, the paired runs and the verdict."""
    found = []
    for claim, spec in CLAIMS.items():
        by_seed = _paired_runs(runs, claim, claim_budget(claim, budget)[1])
        for pair in spec["compare"]:
            arm_a, arm_b, measure = pair["a"], pair["b"], pair["measure"]
            paired = [(r[arm_a], r[arm_b]) for r in by_seed.values() if arm_a in r and arm_b in r]
            if not paired:
                continue
            differences = [a[measure] - b[measure] for a, b in paired]
            said, mean, low, high = verdict(differences, pair["expects"], pair["paper"])
            found.append(
                {
                    **pair,
                    "claim": claim,
                    "unit": _unit_text(claim, budget),
                    "paired": paired,
                    "verdict": said,
                    "mean": mean,
                    "low": low,
                    "high": high,
                }
            )
    return found


def _comparison_rows(runs: dict, budget: int) -> tuple[list[str], list[tuple]]:
    """The wide rows of bench/RESULTS.md (every recorded measure of both arms) and each row's effect for the plot."""
    rows, effects = [], []
    for row in comparisons(runs, budget):
        paired, arm_a, arm_b, measure = row["paired"], row["a"], row["b"], row["measure"]
        mean, low, high = row["mean"], row["low"], row["high"]
        # the budget in the label: the 17- and 50-step rows of one comparison are two rows of the figure
        label = f"{row['tests']}, {row['unit']}"
        effects.append((label, measure, mean, low, high, row["expects"] if row["paper"] else None))

        def both(key: str, digits: int, paired=paired) -> str:
            return f"{_mean_of(paired, 0, key, digits)} / {_mean_of(paired, 1, key, digits)}"

        rows.append(
            f"| {row['claim']} | {row['tests']} | {arm_a} − {arm_b} | {measure} | {row['unit']} | "
            f"{_mean_of(paired, 0, measure, 3)} | {_mean_of(paired, 1, measure, 3)} | "
            f"{_effect_text(mean, low, high)} | {_half_width(low, high)} | {len(paired)} | "
            f"{both('accuracy', 3)} | {both('pass@1', 3)} | {both('pass@8', 3)} | {both('clip_fraction', 4)} | "
            f"{both('is_weight_changed', 3)} | {both('ess', 3)} | {both('sampler_ratio_abs_log', 4)} | "
            f"{both('steps', 0)} | {row['verdict']} |"
        )
    return rows, effects


def curve_fits(runs: dict, budget: int) -> dict[tuple[str, str], list[tuple]]:
    """(claim, arm) -> ``(fit, rise)`` per recorded run: ScaleRL's sigmoid fitted to the run's training reward against
    generated tokens, and the share of ``A - R0`` the fitted curve climbs between the run's first and last point (a
    run whose curve does not converge is left out)."""
    from trl_reasoning.evaluation.compute_curves import fit_compute_curve

    fits: dict[tuple[str, str], list] = {}
    for run in runs.values():
        if run["claim"] not in CLAIMS or run["budget"] != claim_budget(run["claim"], budget)[1]:
            continue
        if len(run.get("curve", [])) < 4:
            continue
        tokens, reward = zip(*run["curve"], strict=True)
        try:
            fit = fit_compute_curve(tokens, reward, use_scipy=False, a_max=1.0)  # a binary reward's mean
        except ValueError:
            continue
        ends = fit.predict([min(tokens), max(tokens)])
        rise = float(ends[1] - ends[0]) / (fit.A - fit.R0) if fit.A != fit.R0 else 0.0
        fits.setdefault((run["claim"], run["arm"]), []).append((fit, rise))
    return fits


def _geometric_interval(values: list[float]) -> str:
    """The geometric mean of positive values and its 95% t interval, computed on their logs: B and C_mid are scales,
    and one run's steep or late fit would otherwise dominate an arithmetic mean."""
    if not values:
        return "–"
    return _scale_text(*geometric_t_interval(values))


def _scale_text(mean: float, low: float, high: float) -> str:
    """``0.85 [0.71, 0.99]``; a single run has no interval and says so."""
    return f"{mean:.3g} [{low:.3g}, {high:.3g}]" if low == low and high == high else f"{mean:.3g} (one run)"


def _fit_rows(fits: dict[tuple[str, str], list[tuple]]) -> list[str]:
    """One row per arm: A's mean, and B's and C_mid's geometric means, each with a 95% t interval across seeds.
    A "flat" fit climbs less than ``_RISE_PLACED`` of ``A - R0`` across its run's tokens (C_mid far past or before
    the data, or B near 0): it placed no rise, so its B and C_mid are left out."""
    rows = [
        "| claim | arm | runs | A at 1 | flat | R0 | A [95% t] | B, geometric [95% t] | C_mid, tokens, geometric "
        "[95% t] | R² (median) |",
        "|---|---|---:|---:|---:|---:|---|---|---|---:|",
    ]
    for (claim, arm), arm_fits in sorted(fits.items()):
        mean, low, high = t_interval([fit.A for fit, _ in arm_fits])
        placed = [fit for fit, rise in arm_fits if rise >= _RISE_PLACED]
        cells = [
            _scale_text(mean, low, high),
            _geometric_interval([fit.B for fit in placed]),
            _geometric_interval([fit.C_mid for fit in placed]),
        ]
        r0 = statistics.fmean(fit.R0 for fit, _ in arm_fits)
        r2 = statistics.median(fit.r_squared for fit, _ in arm_fits)
        at_bound = sum(fit.A > 0.999 for fit, _ in arm_fits)
        rows.append(
            f"| {claim} | {arm} | {len(arm_fits)} | {at_bound} | {len(arm_fits) - len(placed)} | {r0:.3f} | "
            f"{' | '.join(cells)} | {r2:.2f} |"
        )
    return rows


def _runs_missing(runs: dict, budget: int, seeds: int) -> dict[str, int]:
    """claim -> the runs still to do for every arm to have seeds 0 .. ``seeds`` - 1."""
    return {
        claim: sum(
            _key(claim, arm, seed, claim_budget(claim, budget)[1]) not in runs
            for arm in spec["arms"]
            for seed in range(spec.get("seeds", seeds))
        )
        for claim, spec in CLAIMS.items()
    }


def _runs_without_curves(runs: dict, budget: int) -> dict[str, list[int]]:
    """claim/arm -> the seeds whose recorded run kept no reward curve (recorded before curves were kept)."""
    missing: dict[str, list[int]] = {}
    for claim, spec in CLAIMS.items():
        for arm in spec["arms"]:
            seeds = sorted(
                run["seed"]
                for run in runs.values()
                if (run["claim"], run["arm"], run["budget"]) == (claim, arm, claim_budget(claim, budget)[1])
                and not run.get("curve")
            )
            if seeds:
                missing[f"{claim}/{arm}"] = seeds
    return missing


def _seed_list(seeds: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    spans: list[list[int]] = []
    for seed in sorted(seeds):
        if spans and seed == spans[-1][1] + 1:
            spans[-1][1] = seed
        else:
            spans.append([seed, seed])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def comparison_table(runs: dict, budget: int) -> tuple[str, list[tuple]]:
    """The claims' table in markdown, narrow enough for a browser (the claim each row tests, the arms, the measure in
    its unit, the effect with its interval, the seeds and the verdict), and each row's effect for the plot;
    ``docs/which-preset.md`` holds it between ``<!-- evidence:start -->`` and ``<!-- evidence:end -->``."""
    _, effects = _comparison_rows(runs, budget)
    lines = [
        "| claim tested | A − B | measure, budget | A − B [95% t] | seeds | verdict |",
        "|---|---|---|---|---:|---|",
    ]
    for row in comparisons(runs, budget):
        lines.append(
            f"| {row['tests']} | {row['a']} − {row['b']} | {row['measure']}, {row['unit']} | "
            f"{_effect_text(row['mean'], row['low'], row['high'])} | {len(row['paired'])} | {row['verdict']} |"
        )
    return "\n".join(lines) + "\n", effects


def wide_comparison_table(runs: dict, budget: int) -> str:
    """bench/RESULTS.md's table: every comparison with both arms' means of every recorded measure."""
    rows, _ = _comparison_rows(runs, budget)
    header = [
        "| claim | tests | arm A − arm B | measure | budget | A (mean) | B (mean) | A − B, mean [95% t] | resolvable ± | "
        "seeds | greedy accuracy A / B | pass@1 A / B | pass@8 A / B | clip fraction A / B | TRL changed-weight "
        "share A / B | ESS A / B | mean abs log(π/μ) A / B | steps A / B | verdict |",
        "|---|---|---|---|---|---:|---:|---|---:|---:|---|---|---|---|---|---|---|---|---|",
    ]
    return "\n".join(header + rows) + "\n"


def marker_blocks():
    """``scripts/marker_blocks.py``, which finds and rewrites the docs' generated blocks (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("marker_blocks", ROOT / "scripts" / "marker_blocks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write_docs_table(table: str) -> None:
    """docs/which-preset.md's copy of the table, and its picture (the effects plot, which the page leads with)."""
    marker_blocks().write_block("evidence", table, ROOT)
    if PLOT.exists():
        DOCS_PLOT.parent.mkdir(exist_ok=True)
        shutil.copyfile(PLOT, DOCS_PLOT)


def summarize(options) -> str:
    runs = read_runs(RUNS)
    narrow, effects = comparison_table(runs, options.budget)
    wide = wide_comparison_table(runs, options.budget)
    fits = curve_fits(runs, options.budget)
    loads = [run.get("load", float("nan")) for run in runs.values()]
    hours = sum(run.get("wall_s", 0.0) for run in runs.values()) / 3600
    missing = _runs_missing(runs, options.budget, seeds=8)
    own_seeds = ", ".join(f"{claim} {spec['seeds']}" for claim, spec in CLAIMS.items() if "seeds" in spec)
    per_run = statistics.median(run["wall_s"] for run in runs.values() if "wall_s" in run)
    to_do = (
        f"Every arm of every claim at its seeds (8; {own_seeds}) needs {sum(missing.values())} more runs "
        f"({', '.join(f'{claim} {count}' for claim, count in missing.items() if count)}): about "
        f"{sum(missing.values()) * per_run / 2 / 3600:.1f} h at the median {per_run:.0f} s a run, two at a time "
        "(runs in steps take longer)."
        if any(missing.values())
        else f"Every arm of every claim has its seeds (8; {own_seeds}; median {per_run:.0f} s a run)."
    )
    no_curve = _runs_without_curves(runs, budget=options.budget)
    table = (
        f"SmolLM2-135M-Instruct, LoRA r=16, lr 2e-4 constant, one-step add/sub/mul, {options.budget} generated completion "
        "tokens per run (a claim in steps: its own optimizer steps, the 'budget' column), held-out set of 64 questions "
        f"x 8 samples; arms paired by seed, 95% Student-t interval of the "
        f"per-seed differences; 'resolvable ±' is the interval's half-width, the smallest effect these seeds could "
        f"call. {len(runs)} runs recorded, {hours:.1f} h of wall time in all (two runs at a time); machine load (1-min "
        f"average at the end of each run): median {statistics.median(loads):.1f} on 2 cores. {to_do} A '–' is a "
        "measure the arm does not have (no clip, no off-policy weights) or that its runs did not record: the k = 8 "
        "arms run before v5 (clip, cispo, dppo_binary, dppo_topk at 17 steps) predate the TRL changed-weight share and "
        "the ESS, which the 50-step rows record for every arm.\n\n"
        + wide
        + "\nCompute curves: ScaleRL's sigmoid R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B) fitted to each run's "
        "training reward (a generation step's mean over its 16 completions) against the generated tokens so far, "
        "then each parameter's mean and 95% t interval across the arm's seeds. The reward is binary, so A is bounded "
        "by 1 (fit_compute_curve's a_max); 'A at 1' counts the runs whose curve was still rising at the end, where A "
        "is not identified and B and C_mid describe the rise only; 'flat' counts the runs whose fitted curve climbs "
        f"less than {_RISE_PLACED:.0%} of A − R0 across the run (it placed no rise), left out of B and C_mid, which "
        "are geometric means with intervals on the log scale (they are scales, and one steep run would dominate a "
        "plain mean). "
        + (
            "Runs recorded before curves were kept are not in this table: "
            + "; ".join(f"{arm} seeds {_seed_list(seeds)}" for arm, seeds in no_curve.items())
            + "."
            if no_curve
            else "Every recorded run kept its curve."
        )
        + "\n\n"
        + "\n".join(_fit_rows(fits))
    )
    print(table)
    _plot(effects)
    _plot_curves(runs, options.budget, fits)
    if options.budget == DEFAULT_BUDGET:
        _write_docs_table(narrow)
    record("The real model: evidence v5 (claims, paired by seed)", table)
    return table


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def _plot(effects) -> None:
    """One panel per measure (pass rates, tokens and nats do not share a scale), one row per comparison: the mean
    difference with its 95% t interval, the side the paper expects shaded green (a comparison no paper made is grey);
    a comparison with a single seed is a grey dot."""
    plt = _pyplot()
    if plt is None or not effects:
        return
    by_measure: dict[str, list[tuple]] = {}
    for effect in sorted(effects, key=lambda effect: effect[0].lower(), reverse=True):  # a preset's rows together
        by_measure.setdefault(effect[1], []).append(effect)
    heights = [len(rows) + 0.8 for rows in by_measure.values()]
    fig, axes = plt.subplots(
        len(by_measure), 1, figsize=(9, 0.8 + 0.42 * sum(heights)), squeeze=False, height_ratios=heights
    )
    for axis, (measure, rows) in zip(axes[:, 0], by_measure.items(), strict=True):
        reach = max([abs(v) for *_, mean, low, high, _e in rows for v in (mean, low, high) if v == v] + [1e-3]) * 1.15
        for row, (_label, _measure, mean, low, high, expects) in enumerate(rows):
            if expects is not None:  # the paper's direction
                side = (0, reach) if expects == "higher" else (-reach, 0)
                axis.fill_betweenx([row - 0.4, row + 0.4], *side, color="tab:green", alpha=0.12, lw=0)
            colour = "tab:blue" if expects is not None else "tab:grey"
            if low == low:  # nan with fewer than two seeds
                axis.errorbar(mean, row, xerr=[[mean - low], [high - mean]], fmt="o", capsize=4, color=colour)
            else:
                axis.plot(mean, row, "o", color="tab:grey")
        axis.axvline(0, color="grey", lw=1)
        axis.set_xlim(-reach, reach)
        axis.set_yticks(range(len(rows)), [label for label, *_ in rows], fontsize=8)
        axis.set_ylim(-0.6, len(rows) - 0.4)
        axis.set_xlabel(f"{measure}: arm A − arm B (mean over seeds, 95% t interval)", fontsize=8)
    axes[0, 0].set_title(
        "Evidence v5 on SmolLM2-135M-Instruct (LoRA): green = the side the paper expects; grey = no paper's claim",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _binned_mean_curve(curves: list[list], budget: int, bins: int = 12) -> tuple[list[float], list[float]]:
    """The seeds' rewards averaged within equal bins of generated tokens (the seeds' steps fall at different token
    counts); the bins span ``budget`` tokens, or the curves' last token where they go past it (a claim in steps)."""
    budget = max([budget] + [tokens for curve in curves for tokens, _ in curve])
    width = budget / bins
    rewards: dict[int, list[float]] = {}
    for curve in curves:
        for tokens, reward in curve:
            rewards.setdefault(min(int(tokens // width), bins - 1), []).append(reward)
    centres = sorted(rewards)
    return [(b + 0.5) * width for b in centres], [statistics.fmean(rewards[b]) for b in centres]


def _plot_curves(runs: dict, budget: int, fits: dict) -> None:
    """Reward against generated tokens, one panel per claim and one line per arm (bin means over seeds), with the
    mean of the arm's fitted sigmoids dashed."""
    plt = _pyplot()
    claims = [c for c in CLAIMS if any(r["claim"] == c and r.get("curve") for r in runs.values())]
    if plt is None or not claims:
        return
    columns = min(3, len(claims))
    grid_rows = -(-len(claims) // columns)
    fig, axes = plt.subplots(grid_rows, columns, figsize=(4.6 * columns, 3.6 * grid_rows), squeeze=False)
    for axis in axes.flat[len(claims) :]:
        axis.set_visible(False)
    for axis, claim in zip(axes.flat, claims, strict=False):
        for index, arm in enumerate(CLAIMS[claim]["arms"]):
            curves = [r["curve"] for r in runs.values() if r["claim"] == claim and r["arm"] == arm and r.get("curve")]
            if curves:
                x, y = _binned_mean_curve(curves, budget)
                axis.plot(x, y, "o-", color=f"C{index}", ms=3, label=f"{arm} ({len(curves)} seeds)")
                _plot_mean_fit(axis, fits.get((claim, arm)), budget, f"C{index}")
        axis.set_title(claim, fontsize=9)
        axis.set_xlabel("generated tokens")
        axis.set_ylabel("training reward")
        axis.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(CURVES_PLOT, dpi=100)
    plt.close(fig)


def _plot_mean_fit(axis, arm_fits: list[tuple] | None, budget: int, colour: str) -> None:
    """The seeds' fitted sigmoids averaged point by point (a sigmoid at the mean parameters can be a step no run
    has)."""
    if not arm_fits:
        return
    import numpy as np

    grid = np.linspace(budget / 40, budget, 80)
    axis.plot(grid, np.mean([fit.predict(grid) for fit, _ in arm_fits], axis=0), "--", color=colour, lw=1)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", nargs="+", default=list(CLAIMS), choices=list(CLAIMS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--budget", type=int, default=DEFAULT_BUDGET, help="generated completion tokens per run")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (one torch thread each)")
    parser.add_argument("--summarize", action="store_true", help="only the table and the plot, from the recorded runs")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.worker:
        Path(options.out).write_text(json.dumps(run_one(json.loads(options.worker))))
        return ""
    if not options.summarize:
        collect(options)
    return summarize(options)


if __name__ == "__main__":
    main()
