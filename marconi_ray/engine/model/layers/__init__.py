"""The engine's layers: every weight is this rank's shard, every forward is local plus
at most one all-reduce (after a row-parallel projection)."""
