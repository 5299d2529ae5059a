"""Leader-only loops.

Each pass is idempotent and fenced in SQL, so a pass cut short and re-run
by another leader does no harm. Loops end through `stop`; cancellation only when leadership is
lost or the server shuts down.
"""
