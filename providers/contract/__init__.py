"""The contract between the gateway and its provider kinds.

    errors     the error tree and its envelope: what a kind raises, what a client reads
    spec       what a kind is built from: one provider's resolved entry in llms.json
    provider   the `Provider` base a kind implements, and the request and answer it handles
    transport  the one interface every upstream HTTP call goes through
    usage      token usage and its price
    lasting    resources that outlive a config snapshot (a pool's worker processes)
    log        the logger everything logs under

Dependencies run one way: provider kinds import this package, never `gateway.*`; the gateway
imports this package and finds the kinds through the `llms_gateway.providers` entry points.
"""
