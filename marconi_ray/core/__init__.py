"""The caching brain: pure Python (stdlib + numpy). Never imports torch, ray or redis.

Layered (import-linter checks it): `sim` (the offline simulator) > `cache` (the prefix
cache and its policies) > `tree` (the radix tree) > `model` (what the cache knows of a
model, `model.hf` for Hugging Face configs) | `wire` (the msgpack record toolkit)."""
