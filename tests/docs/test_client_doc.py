"""docs/client.md's examples run as written, against a real `berth serve` with its built-in
worker: the client documented is the client that works."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


def examples() -> list[str]:
    return BLOCK.findall((ROOT / "docs" / "client.md").read_text())


def test_the_examples_run_as_written(server_factory) -> None:
    sync, asynchronous = examples()
    s = server_factory()
    env = s.env(BERTH_TOKEN=s.token, PYTHONPATH=str(ROOT))
    outputs = []
    for code in (sync, asynchronous):
        r = subprocess.run(
            [sys.executable, "-c", code],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            cwd=ROOT,
        )
        assert r.returncode == 0, r.stderr
        outputs.append(r.stdout)
    lines = outputs[0].splitlines()
    assert lines[0] == "hello"
    assert re.fullmatch(r"job \d+ succeeded, exit code 0", lines[1]), lines
    assert any(line.endswith(" serve active") for line in lines[2:-1]), lines
    assert lines[-1] == "404 no job 1000000000"
    assert outputs[1] == "True\n"
