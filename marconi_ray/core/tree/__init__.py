"""The radix tree of cached token prefixes and its columnar node table."""
