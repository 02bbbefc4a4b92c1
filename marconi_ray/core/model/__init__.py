"""What the cache knows of a model: layer FLOP and byte models, `ModelSpec`, cost model, presets."""
