"""Loading a saved model folder's tokenizer as it was saved (used by the CLI, the demo and the tests).

Not demo code: any local folder whose tokenizer is a generic ``tokenizer.json`` (a character or custom BPE vocabulary
saved by ``PreTrainedTokenizerFast``) needs it, whatever model it belongs to.
"""

from __future__ import annotations

from pathlib import Path

from transformers import PreTrainedTokenizerFast

#: Tokenizer classes that mean "the tokenizer is fully described by tokenizer.json".
_GENERIC_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def load_tokenizer(path: str | Path):
    """Load the tokenizer saved in ``path``, honouring a generic declared class.

    In transformers 5, ``AutoTokenizer`` picks the tokenizer class from the model type when the saved one is generic
    (``TokenizersBackend``): for the tiny Qwen2 above it builds a ``Qwen2Tokenizer`` with byte-level pre-tokenization,
    which drops the character vocabulary's newline and space. A folder whose ``tokenizer_config.json`` declares a
    generic class is therefore loaded with [`~transformers.PreTrainedTokenizerFast`] from its ``tokenizer.json``;
    anything else (a Hub model, a remote folder) goes through ``AutoTokenizer`` as usual.
    """
    from transformers import AutoTokenizer

    if has_generic_tokenizer(path):
        return PreTrainedTokenizerFast.from_pretrained(str(path))
    return AutoTokenizer.from_pretrained(str(path))


def has_generic_tokenizer(path: str | Path) -> bool:
    """Whether ``path`` is a local folder whose tokenizer [`load_tokenizer`] loads differently from AutoTokenizer."""
    import json

    config_file = Path(path) / "tokenizer_config.json"
    if not (config_file.is_file() and (Path(path) / "tokenizer.json").is_file()):
        return False
    return json.loads(config_file.read_text()).get("tokenizer_class") in _GENERIC_TOKENIZER_CLASSES
