"""A tiny Qwen2-VL vision-language model and its processor, built from configs, offline (tests and examples).

The same architecture as Qwen2-VL / Qwen2.5-VL (a vision tower whose patches are merged 2x2 into image tokens, M-RoPE
positions), at a size that trains in milliseconds on a CPU: a 2-layer text model of width 64 over a character-level
vocabulary, a 1-block vision tower, and an image processor that turns a 28x28 image into 4 patches (one image token)
and a 56x56 image into 16 (four tokens). Nothing is downloaded.

``ImageOnlyQwen2VLProcessor`` is Qwen2-VL's processor without its video processor: transformers' video processors
need torchvision, which this project does not install; images go through the same code as Qwen2-VL's own processor.
"""

from __future__ import annotations

import string
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLProcessor
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.processing_utils import ProcessorMixin

SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
#: Qwen2-VL's chat template, reduced to text and image parts (an image part renders as vision start, one image pad
#: that the processor expands to the image's tokens, vision end).
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class ImageOnlyQwen2VLProcessor(Qwen2VLProcessor):
    """Qwen2-VL's processor (image processor + tokenizer) without the video processor, which needs torchvision."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        self.image_token, self.video_token = "<|image_pad|>", "<|video_pad|>"
        self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
        self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
        ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)
        self.video_processor = None


def build_vlm_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer with Qwen2-VL's special tokens (``<|im_end|>`` is EOS, ``<|endoftext|>`` pad)."""
    characters = list(string.printable[:95]) + ["\n"]
    vocab = {token: index for index, token in enumerate(["<unk>"] + characters)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", padding_side="left")
    tokenizer.add_special_tokens(
        {
            "additional_special_tokens": list(SPECIAL_TOKENS[1:]),
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
        }
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_vlm_processor(tokenizer: PreTrainedTokenizerFast | None = None) -> ImageOnlyQwen2VLProcessor:
    """Qwen2-VL's image processor (patch 14, temporal patch 2, 2x2 merge) for small images (28x28 to 56x56)."""
    tokenizer = build_vlm_tokenizer() if tokenizer is None else tokenizer
    image_processor = Qwen2VLImageProcessorPil(
        min_pixels=28 * 28, max_pixels=56 * 56, patch_size=14, merge_size=2, temporal_patch_size=2
    )
    return ImageOnlyQwen2VLProcessor(image_processor=image_processor, tokenizer=tokenizer, chat_template=CHAT_TEMPLATE)


def build_vlm(
    tokenizer: PreTrainedTokenizerFast, seed: int = 0, hidden_size: int = 64, tie_word_embeddings: bool = False
) -> Qwen2VLForConditionalGeneration:
    """A randomly initialised Qwen2-VL (about 0.16M parameters); ``tie_word_embeddings`` as in Qwen2-VL-2B and
    Qwen2.5-VL-3B, whose LM head shares the input embeddings' weight."""
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS}
    config = Qwen2VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer),
            hidden_size=hidden_size,
            intermediate_size=2 * hidden_size,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
            eos_token_id=ids["<|im_end|>"],
            pad_token_id=ids["<|endoftext|>"],
        ),
        vision_config=dict(
            depth=1,
            embed_dim=32,
            hidden_size=hidden_size,
            num_heads=2,
            mlp_ratio=2,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
        ),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=tie_word_embeddings,
    )
    torch.manual_seed(seed)
    model = Qwen2VLForConditionalGeneration(config)
    model.generation_config.eos_token_id = ids["<|im_end|>"]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    return model


def save_tiny_vlm(
    path: str | Path, seed: int = 0, tie_word_embeddings: bool = False
) -> tuple[Path, ImageOnlyQwen2VLProcessor]:
    """Build the tiny VLM and save it (with its tokenizer) to ``path``; returns the path and the processor to pass as
    ``processing_class`` (the processor itself is not saved: ``AutoProcessor`` would rebuild Qwen2-VL's own, which
    needs torchvision for its video processor)."""
    path = Path(path)
    tokenizer = build_vlm_tokenizer()
    build_vlm(tokenizer, seed=seed, tie_word_embeddings=tie_word_embeddings).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path, build_vlm_processor(tokenizer)
