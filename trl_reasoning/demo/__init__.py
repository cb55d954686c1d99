"""The offline demo: a tiny model, a verifiable toy task, a cached SFT warm start and a short RL run.

Run it with ``python -m trl_reasoning.demo`` or ``trl-reasoning demo`` (see `trl_reasoning.demo.run`).
"""
