"""The content-addressed artifact store: blobs named by their sha256.

Importable by the worker: no database, no web framework (an import contract keeps it so). The
S3 store needs the `s3` extra (obstore); only `s3.py` and `factory.py` import it.

Modules: `base` (the `Store` protocol, errors, `put_file`/`get_file`), `local` (a folder),
`http` (a client of `berth cas serve` or `/api/v1/cas`; its docstring is the wire contract),
`cached` (a local LRU copy in front of a remote), `s3`, `factory` (`open_store` from `[cas]`),
`tree` (a folder as one deterministic tar, and safe extraction), `files` (threaded disk I/O).

Contracts:
- A name is 64 lowercase hex characters (`base.check_name`); anything else is BadName.
- Content is checked against its name on every write (Corrupt, nothing kept) and on every whole
  read: the last chunk is held back until the digest is known, so a consumer never receives a
  complete wrong blob. Range reads (`start`/`end`, end exclusive) are not checked.
- `get` and `list` are async generators: Missing comes from the first `__anext__`, before any
  data. Close a generator you leave early (`contextlib.aclosing`).
- `put` always reads the stream to its end, also when the blob is already stored (then it only
  checks it); to skip an upload, `stat` first, as `put_file` does.
- Memory is bounded by a few chunks (1 MiB; S3: a few 16 MiB parts), never the blob's size.
- Every store has an id (`await store.id()`), created at its root on first use and kept forever;
  a worker whose store id differs from the server's is refused (SPEC 3).
- A store holds a network client: `await store.aclose()` when done (a no-op for local and s3).

Pitfalls: a local blob appears only by rename, so a crash leaves at most `.tmp-*` files in the
root (ignored by `list`, safe to delete once old). Failures of the network or of a remote
service are CasError (or Missing, Corrupt), never httpx's or obstore's own types. An S3 bucket
that does not exist shows as a CasError from `id()`, which a worker calls first.
"""
