"""Regenerate README.md's configuration tables from the Settings fields (app/config.py).

``PYTHONPATH=. .venv/bin/python scripts/settings_table.py`` rewrites the part of README.md between
its settings markers (``app.cli.readme_with_configuration_tables``); tests/app/test_cli.py
fails while README says anything else, so a setting added or changed is documented by running this.
"""

from __future__ import annotations

from pathlib import Path

from app.cli import readme_with_configuration_tables

README = Path(__file__).resolve().parents[1] / "README.md"

if __name__ == "__main__":
    README.write_text(readme_with_configuration_tables(README.read_text(encoding="utf-8")), encoding="utf-8")
    print(f"wrote {README}")
