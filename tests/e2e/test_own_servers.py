"""The embedded servers' start leaves the data folder as private as it was."""

from __future__ import annotations

import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from infra.runtime import start_servers
from services.settings import Settings

pytestmark = [pytest.mark.anyio, pytest.mark.nats]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.pg
def test_the_data_folder_stays_0711_after_the_embedded_postgres_starts() -> None:
    # Outside pytest's temporary root, which pytest keeps 0700 whatever a test does.
    root = Path(tempfile.mkdtemp(prefix="ctx-test-mode-"))
    try:
        assert _mode(root) == 0o700
        settings = Settings(data_dir=root / "data", nats_url="nats://127.0.0.1:1")
        servers = start_servers(settings)
        try:
            assert _mode(settings.data_dir) == 0o711  # nobody else may list it
            # Its parent gains traversal only, which the embedded PostgreSQL's own user needs.
            assert _mode(root) == 0o711
        finally:
            servers.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
