"""The cache coordinator: the actor that owns every replica's prefix cache (`actor`), its
journalled state (`cache_state`), routing across replicas (the `routing` package: its
strategies, prefix index, replica table, routing state and the choice), leases (and
`LEASE_GRACE`), the Redis journal and recovery, and the tuner actor it hands alpha
searches to (`tuner_actor`). Torch-free."""
