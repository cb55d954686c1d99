"""``python -m trl_reasoning.demo``: the same as ``trl-reasoning demo`` (see `trl_reasoning.demo.run`)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None):
    """Run the demo with `argv` (default: the command line), as `trl-reasoning demo` does; returns its results."""
    from trl_reasoning.cli import run

    return run(["demo", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    import warnings

    from trl_reasoning.demo.quiet import message_only, quiet_library_noise

    quiet_library_noise()  # the main job only, before its imports print: not for a script that calls main()
    warnings.formatwarning = message_only
    main()
