"""The web UI at /ui: server-rendered pages (Jinja2 through Litestar) with htmx, no Node build.

Its handlers call the same domain functions as the API, declare the same permissions and pass
the same guard (api/guards.py); nothing in domain/ knows the UI exists. `routes.HANDLERS` are
the pages, `actions.HANDLERS` the forms that change something, `session` signs browsers in.
"""
