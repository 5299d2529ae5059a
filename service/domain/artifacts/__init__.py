"""Artifacts: the server's store, and who may put and read which blob in it (SPEC 3).

- `server_store`: the store `[cas]` names, its id and key, and how workers reach it.
- `blobs`: reading and writing blobs, verified against their names; corrupt ones healed.
- `access`: tenants' uploads and reads through their references; workers' by their tokens.
- `references`: what other domain code references for jobs (inputs, code, reported outputs).
- `room`: a tenant's share of the store against its `max_stored_gb`.
"""
