"""Masking a job's secret values in its streamed output, even across read boundaries.

Output arrives in reads of arbitrary size, so a secret can straddle two reads. The redactor
holds back the last (longest secret - 1) characters until more output (or the end) shows
whether they begin a secret; everything before that point is masked and let through.
"""

from collections.abc import Iterable

MASK = "***"
MIN_LENGTH = 3  # masking one or two characters would garble output, not protect anything


class Redactor:
    def __init__(self, secrets: Iterable[str]) -> None:
        # Longest first, so a secret that contains another is masked whole.
        self._secrets = sorted({s for s in secrets if len(s) >= MIN_LENGTH}, key=len, reverse=True)
        self._hold = max((len(s) for s in self._secrets), default=1) - 1
        self._buffer = ""

    def feed(self, text: str) -> str:
        """Add output; return what is safe to show now, masked."""
        if not self._secrets:
            return text
        self._buffer += text
        cut = max(0, len(self._buffer) - self._hold)
        # Never cut through a secret that starts before the cut: move the cut past it (it is
        # whole in the buffer), and look again, since the new cut may cut another.
        moved = True
        while moved:
            moved = False
            for secret in self._secrets:
                start = self._buffer.find(secret, max(0, cut - len(secret) + 1))
                if start != -1 and start < cut:
                    cut, moved = start + len(secret), True
        shown, self._buffer = self._buffer[:cut], self._buffer[cut:]
        return self._mask(shown)

    def flush(self) -> str:
        """The end of the output: show (masked) whatever was held back."""
        rest, self._buffer = self._buffer, ""
        return self._mask(rest)

    def _mask(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, MASK)
        return text
