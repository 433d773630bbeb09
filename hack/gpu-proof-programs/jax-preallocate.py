import json

import jax
import jax.numpy as jnp

x = jnp.ones((1024, 1024)) @ jnp.ones((1024, 1024))
x.block_until_ready()
stats = jax.devices()[0].memory_stats() or {}
print(
    json.dumps(
        {
            "bytes_limit": stats.get("bytes_limit"),
            "pool_bytes": stats.get("pool_bytes"),
            "bytes_reserved": stats.get("bytes_reserved"),
        }
    )
)
