"""Print (or, with ``--write``, update) the table of every preset default and its source
(``trl_reasoning.presets.tables.sources_markdown`` over ``trl_reasoning.presets.PRESETS``).

Run ``python scripts/sources_table.py --write`` after changing a preset default: it rewrites the lines between the
``<!-- preset-sources:start -->`` and ``<!-- preset-sources:end -->`` markers of whichever of README.md and docs/*.md
holds them; ``tests/presets/test_presets_list.py`` checks that they agree. Without ``--write`` it prints the table.
"""

from __future__ import annotations

import sys

from marker_blocks import write_block

from trl_reasoning.presets import PRESETS
from trl_reasoning.presets.tables import sources_markdown

if __name__ == "__main__":
    table = sources_markdown([entry.config_class for entry in PRESETS])
    if "--write" in sys.argv[1:]:
        print(f"wrote the table into {write_block('preset-sources', table)}")
    else:
        print(table, end="")
