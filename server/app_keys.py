"""Typed keys for what the aiohttp application holds."""

from __future__ import annotations

from aiohttp import web

from .host import EngineHost
from .metrics import ServerMetrics
from .settings import ServerSettings

HOST = web.AppKey("host", EngineHost)
METRICS = web.AppKey("metrics", ServerMetrics)
SETTINGS = web.AppKey("settings", ServerSettings)
