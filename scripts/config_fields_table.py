"""Regenerate the field table of docs/configuration.md from the registries and their traits dataclasses
(``trl_reasoning.presets.tables.variant_fields_markdown``).

Run ``python scripts/config_fields_table.py`` after registering a variant or changing a declared field: it rewrites
the block between the ``<!-- config-fields:start -->`` / ``<!-- config-fields:end -->`` markers in place;
``tests/test_config_variants.py`` checks that they agree.
"""

from __future__ import annotations

from pathlib import Path

from trl_reasoning.presets.tables import FIELD_TABLE_MARKERS, variant_fields_markdown

PAGE = Path(__file__).parents[1] / "docs" / "configuration.md"

if __name__ == "__main__":
    start, end = FIELD_TABLE_MARKERS
    text = PAGE.read_text()
    before, rest = text.split(start)
    after = rest.split(end, 1)[1]
    PAGE.write_text(before + start + variant_fields_markdown() + end + after)
    print(f"rewrote the field table of {PAGE}")
