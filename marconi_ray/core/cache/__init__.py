"""The prefix cache over the tree: admission, eviction, tiers, snapshots, the alpha tuner."""
