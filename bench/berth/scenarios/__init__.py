"""berth's benchmark scenarios, one module each; ``bench/berth/berth_bench.py`` runs them.

Each module's ``run`` takes the parsed options (and, where the scenario budgets its own time,
when the run started) and returns the result: one JSON object, with ``error`` on a failure.
``shared`` holds what several use: the admin client, job bodies, the open-loop submitter, token
files and mark folders. They import ``common`` as a top-level module: ``berth_bench.py`` puts
``bench/berth`` on ``sys.path`` first.
"""
