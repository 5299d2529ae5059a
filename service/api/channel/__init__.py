"""The server's side of the worker channel: one websocket per attached worker.

Contracts:
- Each session has its own send queue and sender task: a worker that stops reading delays
  nobody else, and is cut off once its queue is full (it reconnects and resumes).
- Beats are folded into one UPDATE per flush and acked after it commits: an ack means the
  database has seen the worker, which is what the worker's self-fencing counts on.
- Reports are applied in batches and answered with `received(upto)` only after they commit; a
  batch the database cannot take right now is kept and retried, never dropped.
- The dispatcher runs passes back to back whenever poked (a job was queued anywhere, a slot
  freed here, a worker attached), for the workers attached to this server only.
"""
