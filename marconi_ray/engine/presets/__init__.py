"""Named random-weight models: preset shapes, their transformers configs, the byte tokenizer,
`make_model`, and the per-family report of what the engine runs."""
