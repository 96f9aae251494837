"""Structured output with the bundled model: valid answers and speed, free against constrained.

Three experiments in one run, all greedy, on the same engine:
1. AI-task structures (32, Home Assistant selectors converted the way Home Assistant does):
   how many answers parse and validate, unconstrained and held to the JSON schema.
2. Tool calls: 5 Home-Assistant-like tools, 20 requests; how many lead to a call, and
   whether every call names an offered tool and fits its schema.
3. Masking cost: 32 constrained sequences decoding together; the share of each step spent
   filling and applying grammar masks, and tokens/s against 32 free sequences.

Run: ``scripts/bench structured [--device cuda] [--out FILE.json]``.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import probatio
from homeassistant.exceptions import HomeAssistantError
from homeassistant.helpers import llm, selector

# The integration's own parsers and prompts: imported from the checkout, whose root is on
# the path under ``python -m benchmarks``.
from custom_components.paged_llm.ai_task import parse_structured_output
from custom_components.paged_llm.const import DEFAULT_MAX_TOKENS, STRUCTURE_FREQUENCY_PENALTY
from custom_components.paged_llm.prompt import format_tool, json_schema_instruction
from custom_components.paged_llm.tool_calls import parse_tool_calls
from paged_llm.engine.config import EngineConfig
from paged_llm.engine.core.sequence import FinishReason, SamplingParams
from paged_llm.engine.llm_engine import LLMEngine
from paged_llm.engine.model.loader import DEFAULT_MODEL, load_model
from paged_llm.engine.structured.tool_grammar import tool_call_structural_tag
from paged_llm.protocol.tool_prompt import TOOL_PROMPT

from . import ROOT, argument_parser

SYSTEM = "You are a Home Assistant expert and help users with their tasks."
REQ, OPT = probatio.Required, probatio.Optional
BOOL = selector.BooleanSelector()
TEXT = selector.TextSelector()


def num(lo: float | None = None, hi: float | None = None) -> Any:
    """A number selector with optional bounds."""
    cfg: dict[str, Any] = {"mode": "box"}
    if lo is not None:
        cfg["min"] = lo
    if hi is not None:
        cfg["max"] = hi
    return selector.NumberSelector(cfg)


def pick(*options: str, multiple: bool = False) -> Any:
    """A select selector (an enum in the schema)."""
    return selector.SelectSelector({"options": list(options), "multiple": multiple})


# (instructions, structure): booleans, numbers, text, enums, lists, nested, optional keys.
TASKS: list[tuple[str, probatio.Schema]] = [
    ("Is it a good idea to open the windows when it is 30 degrees outside?", {REQ("answer"): BOOL}),
    ("Should the porch light be on at midnight?", {REQ("on"): BOOL, OPT("reason"): TEXT}),
    ("How many minutes are in two hours?", {REQ("minutes"): num()}),
    ("Pick a comfortable bedroom temperature in Celsius.", {REQ("temperature"): num(15, 25)}),
    ("Rate the urgency of a water leak from 1 to 5.", {REQ("urgency"): num(1, 5)}),
    ("Write a short title for a notification about a door left open.", {REQ("title"): TEXT}),
    ("Summarise: the washing machine finished its cycle.", {REQ("summary"): TEXT}),
    ("Which mode should the thermostat use in winter?", {REQ("mode"): pick("heat", "cool", "off")}),
    ("Classify this event: smoke detected in the kitchen.", {REQ("severity"): pick("low", "high")}),
    ("What colour should the light be for reading?", {REQ("color"): pick("warm", "cold", "red")}),
    (
        "Describe the weather for a picnic: sunny and 22 degrees.",
        {REQ("good_for_picnic"): BOOL, REQ("temperature"): num(), REQ("summary"): TEXT},
    ),
    (
        "List three rooms in a typical house.",
        {REQ("rooms"): selector.TextSelector({"multiple": True})},
    ),
    (
        "Which devices should turn off when leaving home?",
        {REQ("devices"): pick("lights", "tv", "heater", "fridge", multiple=True)},
    ),
    ("Name a good name for a smart speaker.", {REQ("name"): TEXT, OPT("nickname"): TEXT}),
    (
        "Give the brightness (0-100) and whether the hall light should be on in the evening.",
        {REQ("on"): BOOL, REQ("brightness"): num(0, 100)},
    ),
    (
        "Create a reminder to water the plants at 8.",
        {REQ("task"): TEXT, REQ("hour"): num(0, 23), OPT("repeat"): BOOL},
    ),
    ("How many legs does a cat have?", {REQ("legs"): num(0, 10)}),
    ("Is 17 a prime number?", {REQ("prime"): BOOL}),
    ("Pick the best time of day to run the dishwasher.", {REQ("time"): pick("morning", "night")}),
    (
        "Describe a person who lives in the house: name and age.",
        {REQ("person"): {REQ("name"): str, REQ("age"): int}},
    ),
    (
        "Describe the living room: its temperature and whether the lights are on.",
        {REQ("room"): {REQ("temperature"): float, REQ("lights_on"): bool}, OPT("note"): str},
    ),
    ("Give a greeting for a guest arriving at the door.", {REQ("greeting"): TEXT}),
    (
        "Suggest a scene for movie night.",
        {REQ("scene"): pick("movie", "dinner", "party"), REQ("dim_lights"): BOOL},
    ),
    ("How loud should the alarm be, 0 to 10?", {REQ("volume"): num(0, 10)}),
    (
        "Check a garage door report: the door has been open for 3 hours.",
        {REQ("alert"): BOOL, REQ("hours_open"): num(0), OPT("message"): TEXT},
    ),
    ("Which day is the bin collected? Assume Tuesday.", {REQ("day"): pick("monday", "tuesday")}),
    (
        "Plan the heating: target temperature and whether to use eco mode.",
        {REQ("target"): num(10, 30), REQ("eco"): BOOL, OPT("until"): TEXT},
    ),
    ("List the colours of a rainbow.", {REQ("colors"): [str]}),
    ("Give the battery levels of two sensors.", {REQ("levels"): [int]}),
    (
        "Describe the front door lock state.",
        {REQ("lock"): {REQ("locked"): bool, REQ("battery"): int, OPT("last_user"): str}},
    ),
    ("Should the robot vacuum run today?", {REQ("run"): BOOL, OPT("rooms"): [str]}),
    ("Say whether the fridge door is open: it reports open.", {REQ("open"): BOOL}),
]

TOOLS_SCHEMAS = {
    "HassTurnOn": ("Turns on a device, light or switch", {OPT("name"): str, OPT("area"): str}),
    "HassTurnOff": ("Turns off a device, light or switch", {OPT("name"): str, OPT("area"): str}),
    "HassLightSet": (
        "Sets the brightness of a light",
        {REQ("name"): str, REQ("brightness"): probatio.All(int, probatio.Range(min=0, max=100))},
    ),
    "HassClimateSetTemperature": (
        "Sets the target temperature of a thermostat",
        {OPT("area"): str, REQ("temperature"): probatio.All(float, probatio.Range(min=5, max=35))},
    ),
    "GetLiveContext": ("Gets the current state of the devices in the home", {}),
}
TOOL_PROMPTS = [
    "Turn on the kitchen light.",
    "Switch off the TV in the living room.",
    "Set the bedroom light to 40 percent.",
    "Make the living room warmer, 23 degrees.",
    "Is the front door locked?",
    "Turn off all the lights in the hall.",
    "Dim the office light to 10%.",
    "Turn on the coffee machine.",
    "What's the temperature in the bathroom?",
    "Set the thermostat in the bedroom to 19.",
    "Switch on the garden lights.",
    "Turn the porch light off.",
    "Brightness of the desk lamp to 75.",
    "Which lights are on right now?",
    "Turn on the fan in the bedroom.",
    "Cool the office down to 21 degrees.",
    "Please turn off the heater.",
    "Set the hallway light to full brightness.",
    "Turn on the radio in the kitchen.",
    "Are any windows open?",
]


class _Tool(llm.Tool):
    """A tool description; the benchmark never calls it."""

    def __init__(self, name: str, description: str, params: dict[Any, Any]) -> None:
        self.name = name
        self.description = description
        self.parameters = probatio.Schema(params)

    async def async_call(self, hass: Any, tool_input: Any, llm_context: Any) -> Any:
        """Never called: only the tool's description is offered to the model."""
        raise NotImplementedError


def run_batch(
    engine: LLMEngine, requests: list[tuple[list[int], SamplingParams]]
) -> tuple[list[tuple[str, FinishReason | None, int]], float, list[tuple[float, float, int]]]:
    """Run requests together; (text, reason, tokens) each, seconds, per-step (step, mask, rows)."""
    texts = [""] * len(requests)
    reasons: list[FinishReason | None] = [None] * len(requests)
    counts = [0] * len(requests)
    for i, (ids, params) in enumerate(requests):
        engine.add_request(ids, params, request_id=str(i))
    steps: list[tuple[float, float, int]] = []
    started = time.perf_counter()
    while engine.has_unfinished():
        t = time.perf_counter()
        outs = engine.step()
        steps.append((time.perf_counter() - t, engine.structured.last_mask_s, len(outs)))
        for out in outs:
            i = int(out.request_id)
            texts[i] += out.text
            counts[i] = out.completion_tokens
            if out.finished:
                reasons[i] = out.finish_reason
    elapsed = time.perf_counter() - started
    return list(zip(texts, reasons, counts, strict=True)), elapsed, steps


def task_experiment(engine: LLMEngine, max_tokens: int) -> dict[str, Any]:
    """Valid-answer rate and tokens/s for the AI-task structures, free and constrained."""
    prompts, schemas, structures = [], [], []
    for instructions, fields in TASKS:
        structure = probatio.Schema(fields)
        schema = probatio.to_openapi(
            structure, custom_serializer=llm.selector_serializer, openapi_version="3.1.0"
        )
        text = f"{instructions}\n\n{json_schema_instruction(schema)}"
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]
        prompts.append(engine.tokenize(messages))
        schemas.append(schema)
        structures.append(structure)
    result: dict[str, Any] = {"structures": len(TASKS)}
    for mode in ("free", "constrained"):
        requests = [
            (
                ids,
                SamplingParams(
                    temperature=0,
                    max_tokens=max_tokens,
                    json_schema=schema if mode == "constrained" else None,
                    # As the AI task asks, with or without the grammar.
                    frequency_penalty=STRUCTURE_FREQUENCY_PENALTY,
                ),
            )
            for ids, schema in zip(prompts, schemas, strict=True)
        ]
        outs, elapsed, _ = run_batch(engine, requests)
        valid = cut = 0
        failures = []
        for (text, reason, _n), structure in zip(outs, structures, strict=True):
            cut += reason is FinishReason.LENGTH
            try:
                parse_structured_output(text, structure, reason is FinishReason.LENGTH)
                valid += 1
            except HomeAssistantError as err:
                failures.append(f"{err.translation_key}: {text[:80]!r}")
        tokens = sum(n for _t, _r, n in outs)
        result[mode] = {
            "valid": valid,
            "cut_off": cut,
            "tokens": tokens,
            "seconds": round(elapsed, 2),
            "tokens_per_s": round(tokens / elapsed, 1),
            "failures": failures,
        }
    return result


def tool_experiment(engine: LLMEngine, max_tokens: int) -> dict[str, Any]:
    """Tool calls for 20 requests, free and constrained: calls made, calls that validate."""
    tools = [_Tool(name, desc, params) for name, (desc, params) in TOOLS_SCHEMAS.items()]
    specs = [format_tool(tool, llm.selector_serializer) for tool in tools]
    by_name = {tool.name: tool for tool in tools}
    listing = "\n".join(json.dumps(spec["function"]) for spec in specs)
    system = f"{SYSTEM}\n\n{TOOL_PROMPT.format(tools=listing)}"
    prompts = [
        engine.tokenize([{"role": "system", "content": system}, {"role": "user", "content": q}])
        for q in TOOL_PROMPTS
    ]
    tag = tool_call_structural_tag(specs)
    result: dict[str, Any] = {"tools": len(tools), "prompts": len(prompts)}
    for mode in ("free", "constrained"):
        params = SamplingParams(
            temperature=0,
            max_tokens=max_tokens,
            structural_tag=tag if mode == "constrained" else None,
        )
        outs, elapsed, _ = run_batch(engine, [(ids, params) for ids in prompts])
        with_call = calls = valid = 0
        marker_without_call = 0
        for text, _reason, _n in outs:
            _content, parsed = parse_tool_calls(text, set(by_name))
            marker_without_call += "<tool_call>" in text and not parsed
            with_call += bool(parsed)
            for call in parsed:
                calls += 1
                tool = by_name.get(call.tool_name)
                if tool is None:
                    continue
                try:
                    tool.parameters(call.tool_args)
                except probatio.Invalid:
                    continue
                valid += 1
        tokens = sum(n for _t, _r, n in outs)
        result[mode] = {
            "prompts_with_call": with_call,
            "calls": calls,
            "valid_calls": valid,
            "broken_call_markup": marker_without_call,
            "tokens_per_s": round(tokens / elapsed, 1),
        }
    return result


def mask_experiment(engine: LLMEngine, batch: int, max_tokens: int) -> dict[str, Any]:
    """Mask cost per step with ``batch`` constrained sequences decoding; tokens/s both ways."""
    schemas = [
        probatio.to_openapi(
            probatio.Schema(fields),
            custom_serializer=llm.selector_serializer,
            openapi_version="3.1.0",
        )
        for _i, fields in TASKS
    ]
    prompt = engine.tokenize([{"role": "user", "content": "Answer with JSON about your home."}])
    result: dict[str, Any] = {"sequences": batch}
    for mode in ("free", "constrained"):
        requests = []
        for i in range(batch):
            schema = schemas[i % len(schemas)] if mode == "constrained" else None
            # ignore_eos keeps every sequence decoding, so each step has the whole batch.
            params = SamplingParams(
                temperature=0, max_tokens=max_tokens, json_schema=schema, ignore_eos=True
            )
            requests.append(([*prompt, i % 50 + 100], params))
        _outs, elapsed, steps = run_batch(engine, requests)
        full = [(s, m) for s, m, rows in steps if rows == batch]
        step_s = statistics.mean(s for s, _ in full) if full else float("nan")
        mask_s = statistics.mean(m for _, m in full) if full else float("nan")
        tokens = sum(rows for _s, _m, rows in steps)
        result[mode] = {
            "full_steps": len(full),
            "step_ms": round(step_s * 1e3, 2),
            "mask_ms": round(mask_s * 1e3, 3),
            "mask_share": round(mask_s / step_s, 4) if full else None,
            "tokens_per_s": round(tokens / elapsed, 1),
        }
    return result


def report(res: dict[str, Any]) -> str:
    """A markdown summary."""
    t, c, m = res["tasks"], res["tools"], res["mask"]
    lines = [
        f"Structured output, {res['model']} on {res['device']} (greedy)",
        "",
        "| experiment | free | constrained |",
        "| --- | --- | --- |",
        f"| AI tasks valid (of {t['structures']}) | {t['free']['valid']} | "
        f"{t['constrained']['valid']} |",
        f"| AI tasks cut off at max_tokens | {t['free']['cut_off']} | "
        f"{t['constrained']['cut_off']} |",
        f"| AI tasks tokens/s | {t['free']['tokens_per_s']} | {t['constrained']['tokens_per_s']} |",
        f"| tool prompts with a call (of {c['prompts']}) | {c['free']['prompts_with_call']} | "
        f"{c['constrained']['prompts_with_call']} |",
        f"| tool calls valid / made | {c['free']['valid_calls']}/{c['free']['calls']} | "
        f"{c['constrained']['valid_calls']}/{c['constrained']['calls']} |",
        f"| broken tool-call markup | {c['free']['broken_call_markup']} | "
        f"{c['constrained']['broken_call_markup']} |",
        f"| {m['sequences']} sequences: step ms | {m['free']['step_ms']} | "
        f"{m['constrained']['step_ms']} |",
        f"| {m['sequences']} sequences: mask ms per step (share) | - | "
        f"{m['constrained']['mask_ms']} ({m['constrained']['mask_share']:.1%}) |",
        f"| {m['sequences']} sequences: tokens/s | {m['free']['tokens_per_s']} | "
        f"{m['constrained']['tokens_per_s']} |",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Run the three experiments on one engine, print the summary, write --out if given."""
    parser = argument_parser("structured", __doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    # The AI task agent's default answer length.
    parser.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS)
    parser.add_argument("--mask-batch", type=int, default=32)
    parser.add_argument("--mask-tokens", type=int, default=48)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    config = EngineConfig(
        model=DEFAULT_MODEL,
        device=args.device,
        dtype=args.dtype,
        cache_dir=ROOT / ".cache" / "test-models" / "converted",
        max_model_len=2048,
        max_num_seqs=max(64, args.mask_batch),
    )
    engine = LLMEngine(load_model(config), config)
    res: dict[str, Any] = {"model": DEFAULT_MODEL, "device": str(engine.loaded.device)}
    # Warm up: first compile builds the vocabulary tables; first steps warm the kernels.
    run_batch(engine, [(engine.tokenize("Hi"), SamplingParams(max_tokens=4, json_object=True))])
    res["tasks"] = task_experiment(engine, args.max_tokens)
    res["tools"] = tool_experiment(engine, args.max_tokens)
    res["mask"] = mask_experiment(engine, args.mask_batch, args.mask_tokens)
    print(report(res))
    if args.out:
        args.out.write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    sys.exit(main())
