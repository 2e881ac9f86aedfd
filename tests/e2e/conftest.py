"""What every browser test shares: one Chromium per test module."""

from __future__ import annotations

import pytest
from test_browser import CHROME_ARGS, CHROMIUM


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROME_ARGS)
        yield b
        b.close()
