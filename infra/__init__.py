"""Infrastructure: migrations, stream provisioning, the embedded servers and the CLI."""

from pathlib import Path

__all__ = ["MIGRATIONS_DIR", "SAMPLES_DIR"]

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
SAMPLES_DIR = Path(__file__).parent / "samples"
