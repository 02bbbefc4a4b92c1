"""Hugging Face `config.json` -> `HfArchitecture` -> `ModelSpec`: one parser per hybrid family."""
