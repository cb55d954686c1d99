"""``user_stacklevel`` under ``python -m`` and in the package's own entry points.

Under ``python -m trl_reasoning.demo`` every frame below ``<frozen runpy>`` was library code, so a warning of this
package was located at ``<frozen runpy>:88``; the frozen standard library is library code, and the demo and the command
line are the user's code (their line that called ``train()`` is named). Frames of those files are built here with
``compile`` under their file names, so the stacks are exactly what those processes have.
"""

from __future__ import annotations

import os
import warnings

import torch

from trl_reasoning.algorithms.prompt_sampling import EpochRepeatSampler, RetiredPrompts
from trl_reasoning.utils.user_warnings import _OWN_DIR, user_stacklevel


def _frame_in(filename: str, call: str, namespace: dict) -> None:
    """Run ``call`` in a frame whose code is located in ``filename`` (line 1)."""
    exec(compile(call, filename, "exec"), namespace)


#: A function of the package (its code located in one of its files) that warns with ``user_stacklevel``.
_LIBRARY_FILE = os.path.join(_OWN_DIR, "trainer", "base.py")
_library = {"warnings": warnings, "user_stacklevel": user_stacklevel}
exec(
    compile(
        "def library_warning(_):\n    warnings.warn('deep inside', UserWarning, stacklevel=user_stacklevel())\n",
        _LIBRARY_FILE,
        "exec",
    ),
    _library,
)
_library_warning = _library["library_warning"]


def _caught(run) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    return [w for w in caught if str(w.message) == "deep inside"]


def test_a_frozen_standard_library_frame_is_passed_over():
    """``python -m``: runpy's frozen frame sits between the user's and the package's."""
    caught = _caught(lambda: _frame_in("<frozen runpy>", "library({})", {"library": _library_warning}))
    assert [w.filename for w in caught] == [__file__]


def test_in_the_package_s_entry_points_the_warning_names_their_line():
    for entry_point in (os.path.join(_OWN_DIR, "demo", "run.py"), os.path.join(_OWN_DIR, "cli", "dispatch.py")):
        caught = _caught(
            lambda entry_point=entry_point: _frame_in(
                "<frozen runpy>",
                "entry({})",
                {"entry": lambda _: _frame_in(entry_point, "library({})", {"library": _library_warning})},
            )
        )
        assert [(w.filename, w.lineno) for w in caught] == [(entry_point, 1)]


def test_the_retired_prompts_warning_names_the_line_that_iterates_the_dataloader():
    """The sampler runs under torch's DataLoader: ``stacklevel=2`` named torch's line."""
    retired = RetiredPrompts()
    for key in ("a", "b"):
        retired.retire(key, epoch=0)
    sampler = EpochRepeatSampler(2, mini_repeat_count=1, retired=retired, prompt_keys=lambda: ["a", "b"])
    sampler.set_epoch(1)
    loader = torch.utils.data.DataLoader(list(range(2)), sampler=sampler)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert list(loader) == []
    ours = [w for w in caught if "has been retired" in str(w.message)]
    assert [w.filename for w in ours] == [__file__], [(w.filename, str(w.message)) for w in caught]
