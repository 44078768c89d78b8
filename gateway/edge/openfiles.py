"""The process's open-file limit: raised at start to what the system allows.

Every request held open costs two descriptors (the client's connection and the upstream's), and
shells and many service managers start processes with a soft limit of 1,024 under a far higher
hard one: left there, a burst past ~400 streams fails accepts and upstream connects with "Too
many open files" (under a soft limit of 256, a burst of 300 got no answer at all). Go's runtime
raises the soft limit to the hard one at start for the same reason; so does `gateway serve`,
before its workers fork.
"""

from __future__ import annotations

import resource
import sys

# Descriptors a request holds at the most (client connection, upstream connection), and what the
# process keeps besides (listening socket, logs, idle kept-alive connections, the pool's pipes).
PER_REQUEST = 2
RESERVE = 256


def raise_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard one where it is lower; the soft limit after
    (`sys.maxsize` for unlimited)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # Unlimited is not a value setrlimit takes for the soft limit: the kernel's default nr_open.
    wanted = 1 << 20 if hard == resource.RLIM_INFINITY else hard
    if soft == resource.RLIM_INFINITY:
        return sys.maxsize
    if soft >= wanted:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (ValueError, OSError):  # a sandbox that refuses: keep what we have
        return soft
    return wanted


def requests_within(open_files: int) -> int:
    """How many requests at once `open_files` descriptors carry."""
    return max(0, (open_files - RESERVE) // PER_REQUEST)
