"""The model card of a trl-reasoning run: TRL's card plus the algorithm, its non-default settings and its paper.

[`ReasoningModelCardMixin`] overrides TRL's public `create_model_card` (called by `save_model` checkpoints,
`push_to_hub` and by hand). It keeps TRL's card (front matter, quick start, framework versions, citations) and adds:

- the tags `trl`, `trl-reasoning` and the algorithm's name (TRL already adds the trainer's `_tag_names`);
- a "trl-reasoning" section naming the algorithm, its paper, the pieces it is made of (advantage estimator, policy
  objective, loss aggregation) and a table of every setting that differs from the config class's defaults;
- the paper's BibTeX (TRL's template prints `_paper["citation"]` under "Citations").
- the base model also when it was loaded from a local folder (TRL writes "a fine-tuned version of [None]"): its Hub
  name where the folder records one (the converted SmolLM2), else the folder's name; and a quick start that loads the
  trained model (the Hub repository, else the output folder) rather than `model="None"`.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
from typing import Any

#: Config fields that describe where and how a run is stored or reported, not how the model was trained.
BOOKKEEPING_FIELDS = frozenset(
    {
        "output_dir",
        "logging_dir",
        "run_name",
        "report_to",
        "push_to_hub",
        "hub_model_id",
        "hub_token",
        "hub_private_repo",
        "hub_strategy",
        "hub_always_push",
        "hub_revision",
        "overwrite_output_dir",
        "disable_tqdm",
        "log_level",
        "log_level_replica",
        "logging_first_step",
        "save_strategy",
        "save_steps",
        "save_total_limit",
        "save_only_model",
        "local_rank",
        "dataloader_num_workers",
        "resume_from_checkpoint",
        "trackio_space_id",
        "project",
    }
)
#: Fields that every config derives in `__post_init__` from the algorithm's pieces (TRL-compatibility mirrors) or
#: the batch sizes, where the config class leaves them at `None`.
DERIVED_FIELDS = frozenset({"loss_type", "scale_rewards", "generation_batch_size", "steps_per_generation"})
#: The fields that name an algorithm's pieces, shown first.
ALGORITHM_FIELDS = ("advantage_estimator", "policy_loss", "loss_aggregation")
#: The attribute in which `ReasoningConfig.__post_init__` records the values it derived from fields left at their
#: defaults (`{name: derived value}`), so the card can tell them from values the user set.
DERIVED_VALUES_ATTRIBUTE = "_trl_reasoning_derived_values"

_MISSING = object()


def _field_default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return field.default_factory()  # type: ignore[misc]
    return _MISSING


def _normalize(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return list(value)
    return value


def record_derived_values(config: Any, passed: dict[str, Any]) -> None:
    """Remember, on `config`, the fields that were passed at their default and that `__post_init__` changed (device
    and precision settings, `"auto"` lengths, TRL-compatibility mirrors). `passed` holds the field values as they
    were before `__post_init__` ran. Called by `ReasoningConfig.__post_init__`; [`non_default_settings`] reads it."""
    derived = {}
    for field in dataclasses.fields(config):
        if field.name not in passed:
            continue
        default = _normalize(_field_default(field))
        before, after = _normalize(passed[field.name]), _normalize(getattr(config, field.name, _MISSING))
        if before == default and after != before:
            derived[field.name] = after
    object.__setattr__(config, DERIVED_VALUES_ATTRIBUTE, derived)


def non_default_settings(args: Any) -> dict[str, tuple[Any, Any]]:
    """
    The fields of the dataclass `args` whose value differs from the field's default in its own class (so a preset's
    paper defaults count as defaults), leaving out bookkeeping fields (paths, hub, reporting) and values that
    `__post_init__` derived from defaults (recorded by [`record_derived_values`] when the config was built; a value
    changed after that is shown).

    It only reads `args`: it never builds a config, because building one runs `TrainingArguments.__post_init__`,
    which resets accelerate's global state under a running trainer (the card is written with every checkpoint).

    Returns:
        `dict[str, tuple[Any, Any]]`: `{name: (value, default)}` in field order.
    """
    if not dataclasses.is_dataclass(args):
        raise TypeError(f"non_default_settings needs a dataclass config, got {type(args).__name__}.")
    derived = getattr(args, DERIVED_VALUES_ATTRIBUTE, {})
    changed = {}
    for field in dataclasses.fields(args):
        if not field.init or field.name.startswith("_") or field.name in BOOKKEEPING_FIELDS:
            continue
        default = _field_default(field)
        if field.name in DERIVED_FIELDS and default is None:
            continue  # derived unless a preset sets it (GSPO's steps_per_generation=4: then a change is shown)
        value = getattr(args, field.name, _MISSING)
        if default is _MISSING or value is _MISSING:
            continue
        value, default = _normalize(value), _normalize(default)
        if value == default:
            continue
        if field.name in derived and value == derived[field.name]:
            continue  # what __post_init__ derived from the default in this environment
        changed[field.name] = (value, default)
    return changed


def _markdown_value(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else str(value)
    return "`" + text.replace("|", "\\|").replace("`", "'") + "`"


def reasoning_card_section(trainer: Any) -> str:
    """The markdown section that the mixin adds to TRL's card: algorithm, paper, pieces and non-default settings."""
    args = trainer.args
    name = getattr(trainer, "_name", type(trainer).__name__)
    paper = getattr(trainer, "_paper", None) or {}
    lines = ["## trl-reasoning", ""]
    intro = f"Trained with **{name}** (`{type(trainer).__name__}`, config `{type(args).__name__}`) from trl-reasoning"
    if paper.get("id"):
        intro += f", the method of [{paper.get('title', paper['id'])}](https://arxiv.org/abs/{paper['id']})"
    lines += [intro + ".", ""]
    pieces = [f"{key} `{getattr(args, key)}`" for key in ALGORITHM_FIELDS if getattr(args, key, None) is not None]
    if pieces:
        lines += ["Algorithm: " + " · ".join(pieces) + ".", ""]
    rollouts = getattr(trainer, "async_rollouts", None)
    if rollouts is not None:
        lines += [
            f"Rollouts: asynchronous, with a deterministic staleness bound of k = {rollouts.behaviour.max_staleness} "
            "generation steps (each batch sampled by the policy of k steps earlier, with TRL's importance-sampling "
            "correction).",
            "",
        ]
    elif getattr(args, "async_rollouts", False) is None:
        lines += ["Rollouts: synchronous (this run could not take the preset's asynchronous rollouts).", ""]
    changed = non_default_settings(args)
    if changed:
        lines += [
            f"Settings that differ from `{type(args).__name__}`'s defaults:",
            "",
            "| setting | value | default |",
            "|---|---|---|",
        ]
        lines += [f"| `{key}` | {_markdown_value(v)} | {_markdown_value(d)} |" for key, (v, d) in changed.items()]
    else:
        lines.append(f"All settings are `{type(args).__name__}`'s defaults.")
    return "\n".join(lines) + "\n"


#: What TRL 1.16's card template renders when it has no base model (a model loaded from a local folder) and no Hub
#: repository (a run not pushed): a link to a Hub model named "None" and a quick start that loads ``model="None"``.
TRL_UNNAMED_BASE = "[None](https://huggingface.co/None)"
TRL_UNNAMED_SNIPPET_MODEL = 'model="None"'


def base_model_of(config: Any) -> tuple[str | None, str]:
    """``(Hub name or None, how the card names the base model)`` for a model whose config is ``config``.

    ``config._name_or_path`` is where transformers loaded the model from. A Hub name is itself (TRL links it too). A
    local folder converted by ``trl_reasoning.models.pretrained`` (SmolLM2) knows its Hub name from its marker; any
    other local folder is named by its base name, unlinked, since no Hub model of that name is known. A model built
    from a config has neither."""
    from .pretrained import recorded_base_model

    name_or_path = str(getattr(config, "_name_or_path", "") or "")
    if not name_or_path:
        return None, "a model built from its config (no name or path recorded)"
    hub_name = recorded_base_model(name_or_path) if os.path.isdir(name_or_path) else name_or_path
    if hub_name is not None:
        return hub_name, f"[{hub_name}](https://huggingface.co/{hub_name})"
    return None, f"`{os.path.basename(os.path.normpath(name_or_path))}` (a local folder)"


def name_base_model_and_output(card: Any, config: Any, trained_model: str) -> None:
    """Fill in what TRL's card leaves as "None" for a model loaded from a local folder and a run not pushed: the base
    model in the text and, when its Hub name is known, in the metadata (``base_model``); the quick start loads
    ``trained_model`` (the Hub repository, or the output folder)."""
    if TRL_UNNAMED_BASE in card.content:
        hub_name, shown = base_model_of(config)
        card.content = card.content.replace(TRL_UNNAMED_BASE, shown)
        if hub_name is not None and getattr(card.data, "base_model", None) is None:
            card.data.base_model = hub_name
    card.content = card.content.replace(TRL_UNNAMED_SNIPPET_MODEL, f"model={json.dumps(trained_model)}")


class ReasoningModelCardMixin:
    """
    Mixin for a TRL trainer (put it first in the bases: `class T(ReasoningModelCardMixin, DAPOTrainer)`) whose
    `create_model_card` writes TRL's card plus the trl-reasoning section ([`reasoning_card_section`]) and the tags
    `trl`, `trl-reasoning` and the algorithm's name. The trainer provides `_name`, `_paper` (`title`, `id`,
    `citation`), `_tag_names` and `args`, as TRL's trainers do.
    """

    def create_model_card(
        self,
        model_name: str | None = None,
        dataset_name: str | None = None,
        tags: str | list[str] | None = None,
    ) -> None:
        """
        Create the model card (`README.md` in `args.output_dir`), as TRL's `create_model_card` does, with the
        trl-reasoning section and tags added.

        Args:
            model_name (`str`, *optional*):
                Name of the model.
            dataset_name (`str`, *optional*):
                Name of the dataset used for training.
            tags (`str` or `list[str]`, *optional*):
                Extra tags for the card.
        """
        if not self.is_world_process_zero():
            return
        tags = [tags] if isinstance(tags, str) else list(tags or [])
        name = getattr(self, "_name", "")
        for tag in ("trl", "trl-reasoning", str(name).lower().replace(" ", "-").replace(".", "")):
            if tag and tag not in tags:
                tags.append(tag)
        super().create_model_card(model_name=model_name, dataset_name=dataset_name, tags=tags)

        from huggingface_hub import ModelCard

        path = os.path.join(self.args.output_dir, "README.md")
        card = ModelCard.load(path)
        trained_model = self.hub_model_id or self.args.hub_model_id or self.args.output_dir
        name_base_model_and_output(card, self.model.config, trained_model)
        section = reasoning_card_section(self)
        content = card.content
        anchor = "### Framework versions"
        if anchor in content:
            content = content.replace(anchor, section + "\n" + anchor, 1)
        else:
            content = content.rstrip("\n") + "\n\n" + section
        card.content = content
        card.save(path)
