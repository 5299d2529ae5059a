"""Identity and permission logic, pure.

Who a caller is (`callers`), what a role may do (`permissions`), and berth's own bearer
tokens (`tokens`).

Pitfalls: a refusal tells the caller little and the log the rest; tenant isolation is also a
required argument of every tenant-data query, never only this layer's check.
"""
