"""The home workload: a seeded mix of voice, automation and summary requests over time."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

AREAS = ["Kitchen", "Living room", "Bedroom", "Office", "Garage", "Garden", "Hallway", "Bathroom"]
DEVICES = [
    ("light", "Ceiling light"),
    ("light", "Lamp"),
    ("switch", "Coffee maker"),
    ("climate", "Thermostat"),
    ("cover", "Blinds"),
    ("sensor", "Temperature"),
    ("sensor", "Humidity"),
    ("lock", "Door lock"),
    ("media_player", "Speaker"),
    ("fan", "Fan"),
]
VOICE = [
    "Turn on the {d} in the {a}.",
    "Is the {d} in the {a} on?",
    "What's the temperature in the {a}?",
    "Switch off every light in the {a} please.",
    "Set the {a} thermostat to 21 degrees.",
    "Close the blinds in the {a}.",
    "Did I leave the {d} on in the {a}?",
]
AUTOMATIONS = [
    "The front door opened at {t} while everyone was away. Recent events: {events}. "
    "Decide which devices to switch and write a short notification for the phone.",
    "It is {t}. The forecast says rain in one hour and the {a} window is open. "
    "Recent events: {events}. Suggest actions and explain them briefly.",
    "Energy report at {t}: {events}. Summarise what used the most power today "
    "and propose one automation to save energy.",
]
WORDS = [
    "the",
    "house",
    "energy",
    "battery",
    "solar",
    "heating",
    "water",
    "garden",
    "meeting",
    "family",
    "school",
    "weekend",
    "report",
    "schedule",
    "delivery",
    "kitchen",
    "window",
    "sensor",
    "temperature",
    "morning",
    "evening",
    "night",
    "update",
    "maintenance",
    "filter",
    "boiler",
    "warranty",
    "invoice",
    "contract",
    "insurance",
    "neighbour",
    "council",
    "recycling",
    "collection",
    "appointment",
    "reminder",
    "holiday",
    "travel",
    "budget",
    "payment",
]


@dataclass(frozen=True, slots=True)
class ClassSpec:
    """Arrival rate and lengths of one request class."""

    rate: float  # arrivals per second (Poisson)
    max_tokens: tuple[int, int]
    extra_tokens: tuple[int, int]  # words of generated context beyond the template


@dataclass(frozen=True, slots=True)
class HomeRequest:
    """One request of the workload: its class, arrival offset and tokens."""

    request_id: str
    priority: str
    arrival: float
    prompt_ids: list[int]
    max_tokens: int


MODES: dict[str, dict[str, Any]] = {
    "quick": {
        "duration": 24.0,
        "interactive": ClassSpec(0.6, (16, 40), (0, 0)),
        "automation": ClassSpec(0.2, (40, 80), (20, 60)),
        "background": ClassSpec(1 / 16, (96, 160), (1200, 1800)),
    },
    "full": {
        "duration": 90.0,
        "interactive": ClassSpec(0.8, (16, 48), (0, 0)),
        "automation": ClassSpec(0.25, (48, 96), (20, 80)),
        "background": ClassSpec(1 / 30, (128, 256), (2000, 3000)),
    },
}


def system_prompt(rng: random.Random) -> str:
    """An Assist-like system prompt: instructions plus the home's areas and devices."""
    lines = [
        "You are a voice assistant for Home Assistant. Answer questions about the world "
        "truthfully. Answer in plain text. Keep it simple and to the point. When controlling "
        "Home Assistant always call the intent tools. Use HassTurnOn to lock and HassTurnOff "
        "to unlock a lock. When controlling a device, prefer passing just name and domain. "
        "When controlling an area, prefer passing just area name and domain.",
        "Static Context: An overview of the areas and the devices in this smart home:",
    ]
    for area in AREAS:
        for domain, name in DEVICES:
            if rng.random() < 0.22:
                state = rng.choice(["on", "off", "21.5", "open", "closed", "locked", "idle"])
                lines.append(f"- names: {area} {name}\n  domain: {domain}\n  state: '{state}'")
                lines.append(f"  areas: {area}")
    return "\n".join(lines)


def _poisson_times(rng: random.Random, rate: float, duration: float) -> list[float]:
    """Arrival offsets of a Poisson process with ``rate`` over ``duration`` seconds."""
    times, t = [], rng.expovariate(rate)
    while t < duration:
        times.append(t)
        t += rng.expovariate(rate)
    return times


def _bursty_times(rng: random.Random, rate: float, duration: float) -> list[float]:
    """Same mean rate, but in bursts of 3 to 6 within a second (everybody comes home)."""
    times: list[float] = []
    t = 0.0
    while True:
        size = rng.randint(3, 6)
        t += rng.expovariate(rate / size)
        if t >= duration:
            return times
        times.extend(min(duration, t + rng.random()) for _ in range(size))


def build_workload(
    tokenizer: Any, mode: str = "quick", seed: int = 0, bursty: bool = False
) -> list[HomeRequest]:
    """The seeded request list of ``mode``, sorted by arrival; same seed, same requests."""
    spec = MODES[mode]
    rng = random.Random(seed)
    system = system_prompt(random.Random(seed + 1))
    requests: list[HomeRequest] = []

    def chat(system_text: str, user: str) -> list[int]:
        messages = [{"role": "system", "content": system_text}, {"role": "user", "content": user}]
        ids = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"]
        return list(ids)

    def words(n: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(n))

    for cls in ("interactive", "automation", "background"):
        cspec: ClassSpec = spec[cls]
        arrivals = (_bursty_times if bursty and cls == "interactive" else _poisson_times)(
            rng, cspec.rate, spec["duration"]
        )
        if cls == "background" and not arrivals:
            arrivals = [spec["duration"] * rng.uniform(0.1, 0.5)]
        for i, t in enumerate(arrivals):
            area = rng.choice(AREAS)
            device = rng.choice(DEVICES)[1].lower()
            if cls == "interactive":
                ids = chat(system, rng.choice(VOICE).format(d=device, a=area.lower()))
            elif cls == "automation":
                events = words(rng.randint(*cspec.extra_tokens))
                text = rng.choice(AUTOMATIONS).format(
                    t=f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}", a=area, events=events
                )
                ids = chat(system, text)
            else:
                document = ". ".join(
                    words(rng.randint(8, 20)).capitalize()
                    for _ in range(rng.randint(*cspec.extra_tokens) // 14)
                )
                ids = chat("Summarize the document for the household in a few sentences.", document)
            requests.append(HomeRequest(f"{cls}-{i}", cls, t, ids, rng.randint(*cspec.max_tokens)))
    requests.sort(key=lambda r: r.arrival)
    return requests
