"""The HTTP API and the worker websocket (Litestar).

Contracts: every route declares one permission in `opt["perm"]` (or `opt["public"]`), enforced
by the one guard in `guards.py`; every BerthError maps to a 4xx/503 JSON body in `errors.py`,
and nothing else may produce a 5xx.
"""
