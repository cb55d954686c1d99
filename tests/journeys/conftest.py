"""Runs every journey with one torch thread. (The ``journey`` marker is registered in pyproject.toml.)

Shared helpers live in ``_helpers.py`` (``from journeys._helpers import ...``), never here: a test module importing
``conftest`` by name gets ``tests/conftest.py``.
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """The tiny models gain nothing from intra-op threads, and on a busy 2-core machine OpenMP threads competing with
    other processes make a 0.05 s step take seconds."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
