"""Floor 2, models: the offline SmolLM2-135M loader, tokenizer loading, tiny models built from configs for tests
and the demo, the FP32 LM head, and the model card. No trainer import."""
