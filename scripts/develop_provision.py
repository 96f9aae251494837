"""Make a fresh development Home Assistant ready: user, Paged LLM entry, dashboard, burst script.

scripts/develop runs this once Home Assistant answers. Every step is skipped when it is
done already, so a second start changes nothing a person set up by hand. It speaks only
Home Assistant's own REST and websocket API, as a browser or the mobile app would.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

DEV_NAME = "Developer"
DEV_USERNAME = "dev"
DEV_PASSWORD = "paged-llm-dev"
DOMAIN = "paged_llm"
DASHBOARD = "paged-llm"
BURST_SCRIPT = "paged_llm_burst"
BURST_TEXT = "paged_llm_burst.txt"
# A pool small enough that the card's grid shows each block, big enough for a summary.
ENTRY_SETTINGS = {
    "model": "bundled",
    "device": "auto",
    "dtype": "auto",
    "kv_budget_mib": 192,
    "block_size": "16",
    "max_num_seqs": 16,
    "max_model_len": 4096,
}
PARAGRAPH = (
    "The residents' meeting opened at seven. The heating in the north stairwell fails on "
    "cold mornings and the contractor will replace the valve next week. The bicycle shed "
    "needs a new lock; three quotes were compared and the cheapest was chosen. The garden "
    "group asked for two more rain barrels and a compost bin behind the playground. The "
    "treasurer reported that the reserve fund covers the roof repair planned for spring. "
)


class ProvisionError(Exception):
    """A step failed; the message says which and why."""


class HomeAssistantAPI:
    """REST and websocket calls to one Home Assistant, with a user's access token."""

    def __init__(self, session: aiohttp.ClientSession, base: str) -> None:
        self.session = session
        self.base = base.rstrip("/")
        self.client_id = self.base + "/"
        self.token: str | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._ids = itertools.count(1)

    async def rest(
        self, method: str, path: str, body: Any = None, *, form: bool = False
    ) -> tuple[int, Any]:
        """One REST call; returns the status and the decoded JSON (or text) body."""
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        kwargs: dict[str, Any] = {"headers": headers}
        if body is not None:
            kwargs["data" if form else "json"] = body
        async with self.session.request(method, self.base + path, **kwargs) as response:
            try:
                return response.status, await response.json(content_type=None)
            except ValueError:
                return response.status, await response.text()

    async def wait_until_up(self, wait_s: float) -> list[dict[str, Any]]:
        """Wait for the onboarding API to answer; returns its steps."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                status, body = await self.rest("GET", "/api/onboarding")
            except aiohttp.ClientError:
                status, body = 0, None
            if status == 200:
                steps: list[dict[str, Any]] = body
                return steps
            if status == 404:  # onboarding finished: its views are gone
                status, _ = await self.rest("GET", "/auth/providers")
                if status == 200:
                    return [{"step": "user", "done": True}]
            await asyncio.sleep(1)
        raise ProvisionError(f"Home Assistant did not answer at {self.base} in {wait_s:.0f} s")

    async def onboard(self, name: str, username: str, password: str) -> None:
        """Create the owner and finish every onboarding step."""
        status, body = await self.rest(
            "POST",
            "/api/onboarding/users",
            {
                "client_id": self.client_id,
                "name": name,
                "username": username,
                "password": password,
                "language": "en",
            },
        )
        if status != 200:
            raise ProvisionError(f"onboarding the user failed ({status}): {body}")
        await self._exchange(body["auth_code"])
        for step, payload in (
            ("core_config", {}),
            ("analytics", {}),
            (
                "integration",
                {"client_id": self.client_id, "redirect_uri": self.client_id + "?auth_callback=1"},
            ),
        ):
            status, body = await self.rest("POST", f"/api/onboarding/{step}", payload)
            if status not in (200, 403):  # 403: that step was done already
                raise ProvisionError(f"onboarding step {step} failed ({status}): {body}")

    async def login(self, username: str, password: str) -> None:
        """Log in through the login flow the web page uses."""
        status, flow = await self.rest(
            "POST",
            "/auth/login_flow",
            {
                "client_id": self.client_id,
                "handler": ["homeassistant", None],
                "redirect_uri": self.client_id,
            },
        )
        if status != 200:
            raise ProvisionError(f"starting the login failed ({status}): {flow}")
        status, result = await self.rest(
            "POST",
            f"/auth/login_flow/{flow['flow_id']}",
            {"client_id": self.client_id, "username": username, "password": password},
        )
        if status != 200 or result.get("type") != "create_entry":
            raise ProvisionError(
                f"logging in as {username!r} failed: this instance was onboarded with other "
                "credentials; delete config/.storage to start over, or set the user up by hand"
            )
        await self._exchange(result["result"])

    async def _exchange(self, code: str) -> None:
        """Trade an authorization code for an access token."""
        status, token = await self.rest(
            "POST",
            "/auth/token",
            {"grant_type": "authorization_code", "code": code, "client_id": self.client_id},
            form=True,
        )
        if status != 200:
            raise ProvisionError(f"getting a token failed ({status}): {token}")
        self.token = token["access_token"]

    async def ws(self, message: dict[str, Any]) -> Any:
        """One websocket command; returns its result or raises with the error."""
        if self._ws is None:
            self._ws = await self.session.ws_connect(self.base + "/api/websocket")
            await self._ws.receive_json()  # auth_required
            await self._ws.send_json({"type": "auth", "access_token": self.token})
            reply = await self._ws.receive_json()
            if reply.get("type") != "auth_ok":
                raise ProvisionError(f"websocket authentication failed: {reply}")
        msg_id = next(self._ids)
        await self._ws.send_json({**message, "id": msg_id})
        while True:
            reply = await self._ws.receive_json()
            if reply.get("id") == msg_id and reply.get("type") == "result":
                break
        if not reply["success"]:
            raise ProvisionError(f"{message['type']} failed: {reply['error']}")
        return reply["result"]

    async def close(self) -> None:
        """Close the websocket."""
        if self._ws is not None:
            await self._ws.close()


async def ensure_user(api: HomeAssistantAPI, steps: list[dict[str, Any]]) -> bool:
    """Onboard with the development user, or log in as it; True when it was created now."""
    if not next((s["done"] for s in steps if s["step"] == "user"), True):
        await api.onboard(DEV_NAME, DEV_USERNAME, DEV_PASSWORD)
        return True
    await api.login(DEV_USERNAME, DEV_PASSWORD)
    return False


async def confirm_http_config(api: HomeAssistantAPI) -> None:
    """Confirm an http: section taken from YAML, which Home Assistant otherwise reverts.

    Home Assistant tries a new HTTP configuration for five minutes and restarts with the
    old one unless someone confirms it works; this instance answering is that proof.
    """
    config = await api.ws({"type": "http/config"})
    if config.get("active_config_type") == "pending":
        await api.ws({"type": "http/config/promote"})


async def ensure_entry(
    api: HomeAssistantAPI, wait_s: float, settings: dict[str, Any]
) -> dict[str, Any]:
    """The Paged LLM entry, created on the bundled model when there is none."""
    status, entries = await api.rest("GET", f"/api/config/config_entries/entry?domain={DOMAIN}")
    if status == 200 and entries:
        return dict(entries[0])
    status, result = await api.rest("POST", "/api/config/config_entries/flow", {"handler": DOMAIN})
    if status != 200:
        raise ProvisionError(f"starting the {DOMAIN} config flow failed ({status}): {result}")
    flow_id = result["flow_id"]
    if result.get("step_id") == "user":
        # First the flow asks where the model runs: here, in this Home Assistant.
        status, result = await api.rest(
            "POST", f"/api/config/config_entries/flow/{flow_id}", {"backend": "embedded"}
        )
        if status != 200 or result.get("step_id") != "embedded":
            raise ProvisionError(f"the engine cannot run in this Home Assistant: {result}")
    status, result = await api.rest("POST", f"/api/config/config_entries/flow/{flow_id}", settings)
    deadline = time.monotonic() + wait_s
    while status == 200 and result.get("type") == "progress" and time.monotonic() < deadline:
        await asyncio.sleep(1)
        status, result = await api.rest("GET", f"/api/config/config_entries/flow/{flow_id}")
    if status != 200 or result.get("type") != "create_entry":
        raise ProvisionError(f"setting up {DOMAIN} on the bundled model failed: {result}")
    return dict(result["result"])


async def entry_entities(api: HomeAssistantAPI, entry_id: str) -> list[str]:
    """The entity ids of one entry, sensors first, in registry order."""
    registry = await api.ws({"type": "config/entity_registry/list"})
    ids = [e["entity_id"] for e in registry if e.get("config_entry_id") == entry_id]
    return sorted(ids, key=lambda e: not e.startswith("sensor."))


def burst_script(entry_id: str, agent: str | None, document: Path) -> dict[str, Any]:
    """A script that sends voice, automation and summary requests at once."""

    def generate(i: int, priority: str, tokens: int, prompt: str) -> dict[str, Any]:
        return {
            "action": f"{DOMAIN}.generate",
            "data": {
                "config_entry_id": entry_id,
                "prompt": prompt,
                "priority": priority,
                "max_tokens": tokens,
                "temperature": 0.7,
            },
            "response_variable": f"{priority}_{i}",
        }

    voice = [
        {
            "action": "conversation.process",
            "data": {"agent_id": agent, "text": text, "language": "en"},
            "response_variable": f"voice_{i}",
        }
        for i, text in enumerate(
            ["Turn on the kitchen light", "What is the temperature in the hall?", "Good night"]
        )
        if agent
    ]
    if not voice:
        voice = [
            generate(i, "interactive", 48, text)
            for i, text in enumerate(["Say good morning.", "Name a colour.", "Count to five."])
        ]
    automation = [
        generate(i, "automation", 96, f"Write a short notification about event number {i}.")
        for i in range(4)
    ]
    background = [
        generate(0, "background", 256, "Write a long story about a lighthouse keeper."),
        {
            "action": f"{DOMAIN}.summarize",
            "data": {
                "config_entry_id": entry_id,
                "path": str(document),
                "max_tokens": 160,
            },
            "response_variable": "summary",
        },
    ]
    return {
        "alias": "Paged LLM: send a burst of requests",
        "description": "Voice, automation and summary requests at once, so the KV pool moves.",
        "icon": "mdi:rocket-launch",
        "mode": "parallel",
        "sequence": [{"parallel": [*background, *voice, *automation]}],
    }


def dashboard_config(entry_id: str, entities: list[str]) -> dict[str, Any]:
    """The development dashboard: the block map, a burst button and the sensors."""
    sensors = [e for e in entities if e.startswith("sensor.")]
    graphs = [e for e in sensors if e.endswith(("kv_cache_usage", "running_sequences"))]
    return {
        "title": "Paged LLM",
        "views": [
            {
                "title": "KV pool",
                "path": "pool",
                "cards": [
                    {
                        "type": "custom:paged-llm-block-map-card",
                        "entry_id": entry_id,
                        "title": "KV cache blocks",
                        "size": "medium",
                    },
                    {
                        "type": "button",
                        "name": "Send a burst of requests",
                        "icon": "mdi:rocket-launch",
                        "entity": f"script.{BURST_SCRIPT}",
                        "show_state": False,
                        "tap_action": {
                            "action": "perform-action",
                            "perform_action": "script.turn_on",
                            "target": {"entity_id": f"script.{BURST_SCRIPT}"},
                        },
                    },
                    {"type": "entities", "title": "Engine", "entities": sensors},
                    {"type": "history-graph", "hours_to_show": 1, "entities": graphs},
                ],
            }
        ],
    }


async def ensure_burst(api: HomeAssistantAPI, config_dir: Path, entry_id: str) -> None:
    """The burst script and the document it summarises."""
    www = config_dir / "www"
    www.mkdir(parents=True, exist_ok=True)
    document = www / BURST_TEXT
    if not document.exists():
        document.write_text(PARAGRAPH * 14, encoding="utf-8")
    status, _ = await api.rest("GET", f"/api/config/script/config/{BURST_SCRIPT}")
    if status == 200:
        return
    states = await api.ws({"type": "get_states"})
    registry = await api.ws({"type": "config/entity_registry/list"})
    agents = [
        e["entity_id"]
        for e in registry
        if e.get("config_entry_id") == entry_id and e["entity_id"].startswith("conversation.")
    ]
    agent = agents[0] if agents and any(s["entity_id"] == agents[0] for s in states) else None
    status, body = await api.rest(
        "POST",
        f"/api/config/script/config/{BURST_SCRIPT}",
        burst_script(entry_id, agent, document.resolve()),
    )
    if status != 200:
        raise ProvisionError(f"creating the burst script failed ({status}): {body}")


async def ensure_dashboard(api: HomeAssistantAPI, entry_id: str) -> None:
    """The dashboard with the card, created once; later edits by hand are kept."""
    dashboards = await api.ws({"type": "lovelace/dashboards/list"})
    if any(d["url_path"] == DASHBOARD for d in dashboards):
        return
    await api.ws(
        {
            "type": "lovelace/dashboards/create",
            "url_path": DASHBOARD,
            "title": "Paged LLM",
            "icon": "mdi:memory",
            "mode": "storage",
            "show_in_sidebar": True,
            "require_admin": False,
        }
    )
    entities = await entry_entities(api, entry_id)
    await api.ws(
        {
            "type": "lovelace/config/save",
            "url_path": DASHBOARD,
            "config": dashboard_config(entry_id, entities),
        }
    )


async def provision(
    base: str, config_dir: Path, wait_s: float, settings: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Run every step; returns what a person (or a test) needs to know.

    ``settings`` replaces the engine settings of a new entry (tests use a tiny model).
    """
    async with aiohttp.ClientSession() as session:
        api = HomeAssistantAPI(session, base)
        try:
            steps = await api.wait_until_up(wait_s)
            created = await ensure_user(api, steps)
            await confirm_http_config(api)
            entry = await ensure_entry(api, wait_s, settings or ENTRY_SETTINGS)
            await ensure_burst(api, config_dir, entry["entry_id"])
            await ensure_dashboard(api, entry["entry_id"])
        finally:
            await api.close()
    return {
        "url": f"{base.rstrip('/')}/{DASHBOARD}/pool",
        "username": DEV_USERNAME,
        "password": DEV_PASSWORD,
        "user_created": created,
        "entry_id": entry["entry_id"],
        "token": api.token,
    }


def main() -> int:
    """Provision the instance at --url and print the development login."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8123")
    parser.add_argument("--config", type=Path, default=Path(__file__).parent.parent / "config")
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    try:
        info = asyncio.run(provision(args.url, args.config, args.timeout))
    except ProvisionError as err:
        print(f"develop: provisioning stopped: {err}", file=sys.stderr)
        return 1
    print(
        "develop: ready.\n"
        f"  dashboard: {info['url']}\n"
        f"  username:  {info['username']}\n"
        f"  password:  {info['password']}\n"
        "  press 'Send a burst of requests' on the dashboard to watch the KV pool move."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
