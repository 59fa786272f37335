"""Debian's chromium for the browser tests: installed here if ``make chromium`` did not run first.

Skipped, saying why, only where apt cannot install it; never under ``CI=true``, where a console
without its browser test would pass unnoticed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, async_playwright

CHROMIUM = Path("/usr/bin/chromium")
# Headless and quiet: no GPU, no sandbox (root in CI), nothing fetched behind the test's back.
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)


def _install() -> str | None:
    """Install chromium with apt; why not, when it cannot."""
    if shutil.which("apt-get") is None:
        return "apt-get is not available"
    if os.geteuid() != 0:
        return "installing chromium needs root (run 'sudo make chromium')"
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE, "text": True}
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "chromium"]
    if subprocess.run(install, env=env, check=False, **quiet).returncode != 0:  # type: ignore[call-overload]
        subprocess.run(["apt-get", "update", "-qq"], env=env, check=False, **quiet)  # type: ignore[call-overload]
        done = subprocess.run(install, env=env, check=False, **quiet)  # type: ignore[call-overload]
        if done.returncode != 0:
            return f"apt-get install chromium failed: {done.stderr.strip()[-300:]}"
    return None


@pytest.fixture(scope="session")
def chromium() -> Path:
    """The chromium executable, installed if need be."""
    if not CHROMIUM.exists():
        why = _install()
        if why is not None or not CHROMIUM.exists():
            reason = (
                f"Debian's chromium is not installed and cannot be here: {why or 'not found after install'}"
            )
            if os.environ.get("CI", "").lower() == "true":
                pytest.fail(reason)
            pytest.skip(reason)
    return CHROMIUM


@pytest.fixture
async def browser(chromium: Path) -> AsyncIterator[Browser]:
    """Headless chromium driven by Playwright."""
    async with async_playwright() as pw:
        launched = await pw.chromium.launch(executable_path=str(chromium), args=list(CHROMIUM_ARGS))
        try:
            yield launched
        finally:
            await launched.close()
