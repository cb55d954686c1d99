"""The offline demo: a tiny model, a toy verifiable task and a short RL run (``python -m trl_reasoning.demo``)."""
