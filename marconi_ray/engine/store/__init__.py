"""The state store: cached tree nodes' KV rows and SSM states on the device and host tiers."""
