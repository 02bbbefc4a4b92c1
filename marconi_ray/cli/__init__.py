"""Command-line interface (`marconi-ray`)."""
