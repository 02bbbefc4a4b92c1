"""A model replica: the Serve deployment with its continuous-batching loop
(`deployment`), its tensor-parallel shard actors (`shard`, `shard_group`) and the
compiled step graph that fans a step out to them (`step_graph`). Shards reach the model
and its kernels through the engine."""
