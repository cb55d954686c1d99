"""Print the table of every preset default and its source (``trl_reasoning.config.sources_markdown``).

Run ``python scripts/sources_table.py`` after changing a preset default and paste the output between the
``<!-- preset-sources -->`` markers of docs/presets.md; ``tests/presets/test_config.py`` checks that they agree.
"""

from __future__ import annotations

import trl_reasoning as tr
from trl_reasoning.config import sources_markdown

PRESET_CONFIGS = [
    tr.DAPOConfig,
    tr.CISPOConfig,
    tr.DPPOConfig,
    tr.MaxRLConfig,
    tr.RLOOConfig,
    tr.DrGRPOConfig,
    tr.ScaleRLConfig,
]

if __name__ == "__main__":
    print(sources_markdown(PRESET_CONFIGS), end="")
