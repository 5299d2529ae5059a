"""Provisioning: the server starts, drains and stops its own workers when jobs wait.

Contracts:
- The loop (service/background/provision.py, leader only) records its intent in Postgres
  before it calls a provider, and reconciles the provider's list with its rows on every pass,
  so a leader that dies mid-pass leaves nothing orphaned or doubled.
- Providers (`providers/`) sit behind one small interface (`providers.base.Provider`: start,
  stop, list); the loop never imports a provider's client library, only `open_provider`.
- Every provisioned worker carries labels naming the pool and the installation id, which is how
  a new leader finds (adopts) what an old one started.
"""
