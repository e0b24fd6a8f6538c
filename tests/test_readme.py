"""The README's Python examples run as written."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) >= 2
    for block in blocks:
        namespace: dict = {}
        exec(compile(block, str(README), "exec"), namespace)
    assert namespace["master"].params().abs().sum() > 0


def test_readme_starts_with_the_two_commands():
    text = README.read_text()
    commands = re.findall(r"^    (bash scripts/setup.sh && .+)$", text, flags=re.M)
    assert len(commands) == 2
    assert commands[1].endswith("python -m pytest -q")
    assert "python -m pytest -q" in (README.parents[0] / ".ci" / "run").read_text()
