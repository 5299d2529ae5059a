"""berth: a control plane that runs jobs on workers spread over many machines."""

__version__ = "0.1.0"
