"""The banners of ``trainer/base.py`` ("TRL private override N of M") and ``trl_api.TRL_PRIVATE_API`` can be walked
side by side: the banners count 1..M in file order, each sits right above the ``def`` of the list's N-th entry, and
the list's overrides come first, in the same order."""

from __future__ import annotations

import re
from pathlib import Path

from trl_reasoning.trainer import base as seam
from trl_reasoning.trainer import trl_api

_BANNER = re.compile(r"^    # -+ TRL private overrides? (?P<number>.+) of (?P<total>\d+)$")
_DEF = re.compile(r"^    def (\w+)\(")


def banners(source: str) -> list[tuple[str, str, str]]:
    """``(number, total, the method defined on the next line)`` of each banner of ``source``, in file order."""
    lines = source.splitlines()
    found = []
    for index, line in enumerate(lines):
        match = _BANNER.match(line)
        if match:
            method = _DEF.match(lines[index + 1])
            found.append((match["number"], match["total"], method[1] if method else lines[index + 1].strip()))
    return found


def test_the_override_banners_count_in_file_order_and_follow_trl_private_api():
    found = banners(Path(seam.__file__).read_text())
    total = len(found)
    assert total >= 10, "the banners are found, so the check can fail"
    assert [(number, count) for number, count, _ in found] == [(str(n), str(total)) for n in range(1, total + 1)]
    listed = list(trl_api.TRL_PRIVATE_API)
    assert [method for _, _, method in found] == listed[:total], "a banner not right above the list's method"
    overridden = [name for name in listed if name in vars(seam.ReasoningTrainer)]
    assert overridden == listed[:total], "an override of TRL_PRIVATE_API without its banner, or listed after a call"
