"""The router: whether a request may leave the machine, and how it leaves when it may.

- ``policy``: ``route(request, policy, signals) -> Decision``, a pure function;
- ``targets``: the OpenAI-compatible endpoints of the user file and the effective policy;
- ``redact``: secrets out of every byte that leaves;
- ``cloud``: the async httpx client for those endpoints (streaming, retries, offline guard);
- ``audit``: one row per request that left, in the per-user history database;
- ``service``: ``Router``, the daemon's handle on all of the above for one workspace.
"""
