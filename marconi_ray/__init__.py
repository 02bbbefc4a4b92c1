"""marconi-ray: prefix caching for Hybrid (Attention + SSM) LLMs, served on Ray Serve."""

__version__ = "0.1.0"
