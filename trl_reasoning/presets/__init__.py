"""Floor 5, the presets: one module per algorithm, each a config dataclass with the paper's defaults (every default
sourced) and a thin trainer subclass."""
