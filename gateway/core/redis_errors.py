"""What a Redis call raises when Redis is away or misbehaves, for the parts that hold a client.

redis is imported here only when asked, by a part given a client: a gateway without the Redis
state backend never loads it (megabytes in every worker, and part of each start).
"""

from __future__ import annotations


def redis_trouble() -> tuple[type[Exception], ...]:
    """The exceptions a Redis read or write raises when Redis cannot answer."""
    from redis.exceptions import RedisError

    return (RedisError, OSError)
