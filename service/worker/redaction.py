"""Masking a job's secret values in its streamed output, even across read boundaries.

Output is bytes, read in pieces of arbitrary size, so a secret can straddle two reads. The
redactor holds back the longest tail of what it was given that is the beginning of a secret,
until more output (or the end) shows whether the secret follows; everything before that point is
masked and let through. Output that could not begin a secret is never held, so a prompt on a
terminal (`berth job exec --tty`) shows at once. Secrets are
matched as their UTF-8 bytes, so masking needs no decoding and passes any binary output intact.
"""

from collections.abc import Iterable

MASK = b"***"
MIN_LENGTH = 3  # masking one or two bytes would garble output, not protect anything


class Redactor:
    def __init__(self, secrets: Iterable[str | bytes]) -> None:
        values = {s.encode() if isinstance(s, str) else s for s in secrets}
        # Longest first, so a secret that contains another is masked whole.
        self._secrets = sorted((s for s in values if len(s) >= MIN_LENGTH), key=len, reverse=True)
        self._buffer = b""

    def feed(self, data: bytes) -> bytes:
        """Add output; return what is safe to show now, masked."""
        if not self._secrets:
            return data
        self._buffer += data
        cut = len(self._buffer) - self._pending()
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

    def _pending(self) -> int:
        """How many bytes at the buffer's end begin some secret (not all of it)."""
        buffer, held = self._buffer, 0
        for secret in self._secrets:
            # Only a start before the longest hold found so far can hold more.
            start = max(0, len(buffer) - len(secret) + 1)
            while (at := buffer.find(secret[:1], start, len(buffer) - held)) != -1:
                if secret.startswith(buffer[at:]):
                    held = len(buffer) - at
                    break
                start = at + 1
        return held

    def flush(self) -> bytes:
        """The end of the output: show (masked) whatever was held back."""
        rest, self._buffer = self._buffer, b""
        return self._mask(rest)

    def _mask(self, data: bytes) -> bytes:
        for secret in self._secrets:
            data = data.replace(secret, MASK)
        return data
