"""Print (or, with ``--write``, update) the table of the presets (``trl_reasoning.presets.tables.presets_markdown``: each
preset's advantage, objective, aggregation and other defaults, read from ``PRESETS`` and the configs).

Run ``python scripts/presets_table.py --write`` after adding a preset or changing one's defaults: it rewrites the lines
between the ``<!-- presets:start -->`` and ``<!-- presets:end -->`` markers of whichever of README.md and docs/*.md
holds them; ``tests/presets/test_presets_list.py`` checks that they agree. Without ``--write`` it prints the table.
"""

from __future__ import annotations

import sys

from marker_blocks import write_block

from trl_reasoning.presets.tables import presets_markdown

if __name__ == "__main__":
    if "--write" in sys.argv[1:]:
        print(f"wrote the table into {write_block('presets', presets_markdown())}")
    else:
        print(presets_markdown(), end="")
