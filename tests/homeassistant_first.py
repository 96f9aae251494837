"""A pytest plugin loaded before every installed one (``-p`` in pyproject's addopts).

It bridges pytest-homeassistant-custom-component 0.13.375 (the newest release, built
from Home Assistant 2026.10.4's test harness) to Home Assistant 2026.11; drop each part
once a release of the harness pins homeassistant==2026.11.x.

- Home Assistant 2026.11 replaced httpx with httpx2: importing ``homeassistant`` aliases
  ``httpx`` (and ``httpcore``) to them and refuses to once ``httpx`` is imported. The
  harness imports respx (and so httpx) before Home Assistant, and our server tests' OpenAI
  client imports httpx too. Importing Home Assistant here first gives every test the one
  httpx Home Assistant itself runs with.
- 2026.11 moved ``_clear_logger_overwrites`` from the logger integration's package to its
  ``helpers`` module; the harness still imports it from the package.
"""

import homeassistant  # noqa: F401
from homeassistant.components import logger
from homeassistant.components.logger import helpers as logger_helpers

if not hasattr(logger, "_clear_logger_overwrites"):
    logger._clear_logger_overwrites = logger_helpers._clear_logger_overwrites  # type: ignore[attr-defined]
