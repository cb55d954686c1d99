"""Floor 2, verifiable tasks with their reward functions: one-step arithmetic (the real-model main job), digit
reversal (the tiny demo) and digit-chain sums (the evidence testbed). Reward functions here can be named in a YAML
recipe by their dotted path, e.g. ``trl_reasoning.tasks.digit_reversal.digit_reward``."""
