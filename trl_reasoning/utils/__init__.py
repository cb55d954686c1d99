"""Floor 0, utilities with no knowledge of RL: warnings that point at the user's line, thread counts, config field
types. Imports nothing from the rest of the package."""
