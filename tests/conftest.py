"""Cross-package tests: their helpers (not shipped in any wheel) import from this folder."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # browser_screenshot, under importlib mode
