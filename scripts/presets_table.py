"""Print (or, with ``--write``, update) the two tables of the presets, read from ``PRESETS``, the configs and the
registries: the README's (``trl_reasoning.presets.tables.presets_markdown``: each preset's advantage, objective,
aggregation and other defaults) and docs/algorithms.md's (``preset_pieces_markdown``: each piece the preset chooses,
with the defaults it sets for it).

Run ``python scripts/presets_table.py --write`` after adding a preset or changing one's defaults: it rewrites the lines
between the ``<!-- presets:start -->`` / ``<!-- presets:end -->`` and the ``<!-- preset-pieces:start -->`` /
``<!-- preset-pieces:end -->`` markers of whichever of README.md and docs/*.md holds them;
``tests/presets/test_presets_list.py`` checks that they agree. Without ``--write`` it prints the tables.
"""

from __future__ import annotations

import sys

from marker_blocks import write_block

from trl_reasoning.presets.tables import preset_pieces_markdown, presets_markdown

BLOCKS = {"presets": presets_markdown, "preset-pieces": preset_pieces_markdown}

if __name__ == "__main__":
    for name, table in BLOCKS.items():
        if "--write" in sys.argv[1:]:
            print(f"wrote the table {name} into {write_block(name, table())}")
        else:
            print(f"<!-- {name} -->\n{table()}")
