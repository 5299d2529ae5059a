"""Secret values are masked in streamed output however the output is split into reads."""

import random

import pytest

from service.worker.redaction import MASK, Redactor

SECRETS = ["s3cr3t-value", "hunter2x", "cr3t"]


def stream(text: str | bytes, cuts: list[int], secrets: list[str]) -> str:
    data = text.encode() if isinstance(text, str) else text
    r = Redactor(secrets)
    out, last = [], 0
    for cut in [*cuts, len(data)]:
        out.append(r.feed(data[last:cut]))
        last = cut
    out.append(r.flush())
    return b"".join(out).decode("utf-8", "surrogateescape")


def masked(text: str, secrets: list[str]) -> str:
    for s in sorted(secrets, key=len, reverse=True):
        text = text.replace(s, MASK.decode())
    return text


class TestRedactor:
    @pytest.mark.parametrize("seed", range(200))
    def test_any_split_gives_the_same_masked_output(self, seed):
        """Split anywhere, the output equals the whole text masked, and no secret survives."""
        rng = random.Random(seed)
        parts = [
            rng.choice(["abc ", "s3cr3t-value", "hunter2x", "\n", "cr3", "t ", "é"])
            for _ in range(rng.randint(1, 30))
        ]
        text = "".join(parts)
        size = len(text.encode())
        cuts = sorted(rng.sample(range(size + 1), k=min(size, rng.randint(0, 10))))
        got = stream(text, cuts, SECRETS)
        assert got == masked(text, SECRETS)
        assert all(s not in got for s in SECRETS)

    def test_byte_by_byte(self):
        """One byte per read still masks a secret that arrives across many reads."""
        text = "key=s3cr3t-value; next=hunter2x\n"
        assert stream(text, list(range(1, len(text))), SECRETS) == "key=***; next=***\n"

    def test_binary_output_passes_intact(self):
        """NUL bytes and invalid UTF-8 pass through unchanged; only the secret is masked."""
        data = b"\x00\xff\xfe s3cr3t-value \x80\x00"
        r = Redactor(SECRETS)
        got = r.feed(data[:7]) + r.feed(data[7:]) + r.flush()
        assert got == b"\x00\xff\xfe *** \x80\x00"

    def test_no_secrets_passes_through_at_once(self):
        """Without secrets nothing is held back."""
        r = Redactor([])
        assert r.feed(b"partial") == b"partial"
        assert r.flush() == b""

    def test_short_values_are_not_masked(self):
        """A one- or two-character value is not masked (it would garble output)."""
        assert stream("a=1 b=22", [3], ["1", "22"]) == "a=1 b=22"

    def test_only_what_could_begin_a_secret_is_held(self):
        """Output that cannot begin a secret shows at once (a terminal's prompt); a tail that
        begins any secret, the longest such tail, waits for what follows."""
        r = Redactor(["hunter2x", "xyzzy-long-secret"])
        assert r.feed(b"ready\n") == b"ready\n"
        assert r.feed(b"$ ") == b"$ "
        # "xyz" begins the second secret; "x" alone would begin the first too: hold all three.
        assert r.feed(b"abc xyz") == b"abc "
        assert r.feed(b"zy-long-secret!") == b"***!"
        assert r.feed(b"hunt") == b""
        assert r.feed(b"er2") == b""
        assert r.feed(b"y") == b"hunter2y"
