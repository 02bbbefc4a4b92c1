"""Package data: a small tokenized ShareGPT sample trace."""
