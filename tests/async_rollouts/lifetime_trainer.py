"""A training script for tests/async_rollouts/test_generator_lifetime.py: the generator process, many steps, one line per step.

``python lifetime_trainer.py MODEL OUTPUT_DIR`` trains (until killed); on a ``KeyboardInterrupt`` it prints what it
left behind: ``GENERATOR`` (whether the pipeline holds a generator) and ``CHILDREN`` (its child processes other than
multiprocessing's resource tracker, zombies included), then exits 0.
"""

from __future__ import annotations

import sys
import time
import traceback

import psutil
from conftest import cpu_args, digit_fraction, make_prompts
from transformers import TrainerCallback

import trl_reasoning as tr


class PrintSteps(TrainerCallback):
    """One line per step; after step 2 the trainer stays busy for a minute (a long evaluation, a slow save), so that
    the worker samples what it was sent and waits idle for more."""

    def on_step_end(self, args, state, control, **kwargs):
        print(f"STEP {state.global_step}", flush=True)
        if state.global_step == 2:
            time.sleep(60)


def main(model: str, output_dir: str) -> None:
    args = tr.ReasoningConfig(
        **cpu_args(
            output_dir=output_dir, async_rollouts=True, max_staleness=2, async_generator="process", max_steps=500
        )
    )
    trainer = tr.ReasoningTrainer(model=model, reward_funcs=digit_fraction, args=args, train_dataset=make_prompts())
    trainer.add_callback(PrintSteps())
    print("TRAINING STARTS", flush=True)
    try:
        trainer.train()
    except KeyboardInterrupt:
        print("INTERRUPTED", flush=True)
        print(traceback.format_exc(), flush=True)
        children = []
        for child in psutil.Process().children(recursive=True):
            try:
                if "resource_tracker" not in " ".join(child.cmdline()):
                    children.append((child.pid, child.status()))
            except psutil.Error:  # a zombie has no command line
                children.append((child.pid, "gone or zombie"))
        print(f"GENERATOR {trainer.async_rollouts.pipeline._generator is not None}", flush=True)
        print(f"CHILDREN {children}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:3])
