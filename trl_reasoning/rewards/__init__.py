"""Floor 1, rewards: wrapping user reward functions (errors named, NaN/None reported, timeouts bounded), the overlong
penalty, and math-answer extraction for GSM8K-style tasks. No tensors beyond a reward column, no trainer.

The package exports the public names of ``wrapping`` (the reward wrapper, its errors and the overlong penalty).
"""

from .wrapping import (
    REWARD_ERROR_POLICIES,
    RewardFunctionError,
    RewardTimeoutError,
    binarize_rewards,
    check_reward_columns,
    non_binary_reward_functions,
    overlong_penalty,
    wrap_reward_function,
)

__all__ = [
    "REWARD_ERROR_POLICIES",
    "RewardFunctionError",
    "RewardTimeoutError",
    "binarize_rewards",
    "check_reward_columns",
    "non_binary_reward_functions",
    "overlong_penalty",
    "wrap_reward_function",
]
