"""``python -m trl_reasoning.cli`` (and ``accelerate launch -m trl_reasoning.cli``): the ``trl-reasoning`` command."""

from .dispatch import main

if __name__ == "__main__":
    main()
