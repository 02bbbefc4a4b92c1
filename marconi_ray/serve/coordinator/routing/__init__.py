"""Routing across replicas: the strategies (`routers`), the index of every replica's cached
states by prompt prefix (`prefix_index`), the replicas' open requests (`replica_table`), the
routing state kept in step with `CacheState` (`state`), and the choice itself (`choose`)."""
