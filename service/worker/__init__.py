"""The remote worker: dials the server over one websocket, runs leased jobs, reports under epochs.

Contracts: imports no database, web-framework or migration code (an import-linter contract and a
subprocess test keep it so), and no structlog: stdlib logging only. A job never outlives its
worker (runner.SHIM), and a worker that hears no ack kills its jobs two heartbeats before the
server could move their leases (main.Watchdog).
"""
