"""User journeys: real cadences (checkpoints and evaluations before max_steps), runs continued past the feature.

A package (this file) so that its test modules (``journeys.test_cli`` …) do not collide with ``tests/cli/test_cli.py``
and its ``conftest.py`` is imported as ``journeys.conftest``, leaving ``from conftest import …`` (tests/conftest.py)
intact for every test module.
"""
