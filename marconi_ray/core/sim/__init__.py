"""The offline simulator: trace replay, the oracle bound, a brute-force reference, reuse classes."""
