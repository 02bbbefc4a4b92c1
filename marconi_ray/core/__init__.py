"""The caching brain: pure Python (stdlib + numpy). Never imports torch, ray or redis."""
