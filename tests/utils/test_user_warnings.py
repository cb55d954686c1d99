"""Warnings raised deep inside the package name the user's line, whichever sub-package raises them."""

import warnings

from trl_reasoning import CISPOConfig
from trl_reasoning.utils.user_warnings import _LIBRARY_DIRS


def test_the_whole_package_counts_as_library_code():
    import trl_reasoning

    assert trl_reasoning.__path__[0].rstrip("/") + "/" in _LIBRARY_DIRS


def test_a_config_warning_points_at_the_line_that_built_the_config(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        CISPOConfig(output_dir=str(tmp_path), epsilon_high=0.5, use_cpu=True, bf16=False)
    ours = [w for w in caught if "epsilon_high" in str(w.message)]
    assert ours, [str(w.message) for w in caught]
    assert {w.filename for w in ours} == {__file__}
