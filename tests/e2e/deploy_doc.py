"""The configuration blocks of docs/DEPLOY.md, as the tests run them.

Each block follows a ``<!-- deploy: NAME -->`` marker. :func:`deploy_block` returns it with the
values a test must change to run on one machine replaced; each replaced value must be in the
block, so a change to the documented configuration changes what the tests run, or fails them.
"""

from __future__ import annotations

import re
from pathlib import Path

DEPLOY_MD = Path(__file__).resolve().parents[2] / "docs" / "DEPLOY.md"


def deploy_block(name: str, replacements: dict[str, str] | None = None) -> str:
    text = DEPLOY_MD.read_text()
    match = re.search(rf"<!-- deploy: {re.escape(name)} -->\n```[a-z]*\n(.*?)\n```", text, flags=re.DOTALL)
    if match is None:
        raise LookupError(f"docs/DEPLOY.md has no block marked 'deploy: {name}'")
    block = match.group(1)
    for documented, tested in (replacements or {}).items():
        if documented not in block:
            raise LookupError(f"docs/DEPLOY.md's {name} block no longer has {documented!r}")
        block = block.replace(documented, tested)
    return block


def env_file(block: str) -> dict[str, str]:
    """The variables of an environment file (``NAME=value`` lines; comments and blank lines skipped)."""
    variables = {}
    for line in block.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, value = line.partition("=")
            variables[name] = value
    return variables


def unit_value(block: str, key: str) -> str:
    """The value of ``key=`` in a systemd unit."""
    for line in block.splitlines():
        if line.startswith(f"{key}="):
            return line.split("=", 1)[1]
    raise LookupError(f"the unit has no {key}=")
