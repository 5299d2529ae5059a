"""Durations on the command line (SPEC section 2).

`90s`, `15m`, `1h`, `30d`; a bare number means days.
"""

import math
import re

UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
FORM = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")


def seconds(text: str) -> float:
    """The duration in seconds; ValueError naming the accepted forms otherwise."""
    match = FORM.match(text)
    value = float(match.group(1)) * UNITS[match.group(2) or "d"] if match else math.nan
    if not match or not math.isfinite(value) or value <= 0:
        raise ValueError(
            f"{text!r} is not a duration: use 90s, 15m, 1h or 30d (a bare number is days)"
        )
    return value
