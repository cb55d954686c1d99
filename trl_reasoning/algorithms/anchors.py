"""What a ratio-based objective takes its importance ratio against: the ratio's *anchor*.

Every clipped, capped or gated objective weighs the current policy ``pi_theta`` against some earlier policy. Three
anchors are in use, and they coincide only on a synchronous, on-policy batch:

``"pi_old"``
    ``rho = pi_theta / pi_old``, ``pi_old`` the weights that scored the batch (TRL's ``old_per_token_logps``), with
    TRL's importance-sampling correction ``pi_old / mu`` (``vllm_importance_sampling_*``) multiplied on where the
    batch was sampled by another engine or an earlier policy. This is ``GRPOTrainer``'s objective. With one
    optimizer step per generation batch ``pi_old`` *is* the learner, so ``rho = 1`` and the clip never acts: on an
    asynchronous batch only the correction bounds how far the update moves from the policy that sampled.
``"sampler"``
    ``rho = pi_theta / mu``, ``mu`` the sampler's own probability of the token (vLLM's log-probs, or those
    ``generate`` sampled from on an asynchronous batch); no separate correction weight, so the mismatch is never
    counted twice. The DPPO paper's GRPO baseline (arXiv 2602.04879, §5.2), and verl's "bypass mode"
    (``old_log_prob = rollout_log_prob``) with its dual clip off: verl keeps ``clip_ratio_c = 3`` by default, which
    drops the gradient of a token with ``A < 0`` and ``pi / mu > 3``; here no such bound applies. The trust region is
    taken against the policy that sampled.
``"decoupled"``
    AReaL's decoupled objective (arXiv 2505.24298, Eq. 5): the clip on ``rho = pi_theta / pi_prox``, ``pi_prox`` the
    weights before this batch's first update (``pi_old`` here), times ``sg(min(pi_prox / mu, C))`` per token (TRL's
    correction in its ``token_truncate`` mode, ``C = vllm_importance_sampling_clip_max``, 3 by default: TRL's
    truncation value). AReaL's own ``behav_imp_weight_cap`` *drops* a token whose ``pi_prox / mu`` passes the cap
    (its default: ``action="mask"`` at 5); truncating keeps the token at weight ``C`` (AReaL's ``action="clamp"``).
    This package truncates because it is TRL's correction at TRL's value, so a run moved from ``"pi_old"`` keeps its
    bound; ``vllm_importance_sampling_mode="token_mask"`` with ``vllm_importance_sampling_clip_max=5.0`` gives
    AReaL's default instead. It differs from ``"sampler"`` only where one generation batch feeds several optimizer
    steps (``steps_per_generation > 1`` or ``num_iterations > 1``): there the clip is against the proximal policy,
    and the stale sampler only reweights.

Which anchors an objective supports, and which it takes on an asynchronous run when ``ratio_anchor`` is left
``None``, are traits of its registration (``anchors``, ``async_anchor`` in ``POLICY_LOSSES``). A synchronous run keeps
TRL's ``"pi_old"`` unless the objective defines no other (DPPO's ratio and mask are the sampler's by definition).
"""

from __future__ import annotations

#: Every anchor, in the order the docs list them.
RATIO_ANCHORS = ("pi_old", "sampler", "decoupled")
#: TRL's objective: the anchor a synchronous run takes by default.
TRL_ANCHOR = "pi_old"
#: The correction mode the decoupled anchor runs by default (the per-token weight truncated at ``C``: AReaL's
#: ``action="clamp"``), and the other one it takes (tokens past ``C`` dropped: AReaL's default ``action="mask"``).
DECOUPLED_CORRECTION_MODE = "token_truncate"
DECOUPLED_MODES = (DECOUPLED_CORRECTION_MODE, "token_mask")


def check_anchor(anchor: str, supported: tuple[str, ...], policy_loss: str, field_name: str = "ratio_anchor") -> None:
    """Raise a ``ValueError`` naming ``field_name`` when ``anchor`` is unknown or ``policy_loss`` does not define it."""
    if anchor not in RATIO_ANCHORS:
        raise ValueError(f"Unknown {field_name} {anchor!r}. Allowed values: {', '.join(RATIO_ANCHORS)}, or None.")
    if anchor not in supported:
        raise ValueError(
            f"{field_name}={anchor!r} is not defined for policy_loss={policy_loss!r}, whose ratio is taken against "
            f"{' or '.join(repr(name) for name in supported)} by definition. Set {field_name}=None."
        )


def default_anchor(supported: tuple[str, ...], async_anchor: str | None, asynchronous: bool) -> str:
    """The anchor a run takes when ``ratio_anchor`` is ``None``: the objective's ``async_anchor`` on an asynchronous
    run, TRL's ``"pi_old"`` otherwise; an objective that does not define that anchor takes its first one."""
    wanted = (async_anchor or TRL_ANCHOR) if asynchronous else TRL_ANCHOR
    return wanted if wanted in supported else supported[0]


def resolve_anchor(
    requested: str | None,
    supported: tuple[str, ...],
    async_default: str | None,
    asynchronous: bool,
    *,
    policy_loss: str,
    correction: bool,
    mode: str,
    trl_default_mode: str,
) -> tuple[str, str]:
    """``(anchor, correction mode)`` of a run: ``requested`` checked, or ``None`` resolved (:func:`default_anchor`).

    ``"decoupled"`` weighs each token by TRL's correction per token: truncated at ``C`` (``token_truncate``, its
    default) or dropped past it (``token_mask``, AReaL's default action); asked for by name, it needs the correction
    on and one of those modes or TRL's default (errors naming the fields); reached as a default where the user turned the correction off or chose another mode, the run keeps
    TRL's objective with that choice (``"pi_old"``) instead."""
    if requested is None:
        anchor = default_anchor(supported, async_default, asynchronous)
        user_correction = not correction or mode not in (trl_default_mode, DECOUPLED_CORRECTION_MODE)
        if anchor == "decoupled" and user_correction:
            anchor = TRL_ANCHOR if TRL_ANCHOR in supported else supported[0]
    else:
        check_anchor(requested, supported, policy_loss)
        anchor = requested
        if anchor == "decoupled" and not correction:
            raise ValueError(
                "ratio_anchor='decoupled' weighs each token by min(pi_prox / mu, C), TRL's importance-sampling "
                "correction: set vllm_importance_sampling_correction=True, or ratio_anchor='sampler'."
            )
        if anchor == "decoupled" and mode not in (trl_default_mode, *DECOUPLED_MODES):
            raise ValueError(
                f"ratio_anchor='decoupled' weighs each token by pi_prox / mu truncated at C "
                f"(vllm_importance_sampling_mode={DECOUPLED_CORRECTION_MODE!r}) or dropped past it ('token_mask'), "
                f"not by vllm_importance_sampling_mode={mode!r}. Use one of those, or ratio_anchor='pi_old' with "
                "that correction."
            )
    if anchor == "decoupled" and mode not in DECOUPLED_MODES:
        mode = DECOUPLED_CORRECTION_MODE
    return anchor, mode
