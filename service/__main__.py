"""`python -m service` is the `berth` command."""

from service.cli import main

main()
