"""SQL, one module per aggregate: plain async functions `(conn, *, ...) -> records`; no commits."""
