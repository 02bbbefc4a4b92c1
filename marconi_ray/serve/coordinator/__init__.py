"""The cache coordinator: the actor that owns every replica's prefix cache (`actor`), its
journalled state (`cache_state`), routing across replicas (`routing`, `routing_index`,
`route_state`, `replica_table`, `replica_choice`), leases, the Redis journal and recovery,
and the tuner actor it hands alpha searches to (`tuner_actor`). Torch-free."""
