"""The config flow's forms: the engine, server and agent schemas, and the values they show."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import probatio
from homeassistant.const import (
    CONF_API_KEY,
    CONF_DEVICE,
    CONF_LLM_HASS_API,
    CONF_MODEL,
    CONF_NAME,
    CONF_PROMPT,
    CONF_TIMEOUT,
    CONF_URL,
)
from homeassistant.core import HomeAssistant
from homeassistant.helpers import llm
from homeassistant.helpers.selector import (
    BooleanSelector,
    NumberSelector,
    NumberSelectorConfig,
    NumberSelectorMode,
    SelectOptionDict,
    SelectSelector,
    SelectSelectorConfig,
    SelectSelectorMode,
    TemplateSelector,
    TextSelector,
    TextSelectorConfig,
    TextSelectorType,
)

from paged_llm.catalogue import BY_KEY
from paged_llm.defaults import DEFAULT_MODEL

from .const import (
    BLOCK_SIZES,
    CONF_BACKEND,
    CONF_BLOCK_SIZE,
    CONF_CUSTOM_MODEL,
    CONF_DTYPE,
    CONF_HOME_GRAMMAR,
    CONF_IDLE_UNLOAD_MIN,
    CONF_KV_BUDGET_AUTO,
    CONF_KV_BUDGET_MIB,
    CONF_MAX_HISTORY,
    CONF_MAX_MODEL_LEN,
    CONF_MAX_NUM_SEQS,
    CONF_MAX_TOKENS,
    CONF_TEMPERATURE,
    CONF_THINK,
    CONF_WEIGHTS,
    DEFAULT_AI_TASK_NAME,
    DEFAULT_BLOCK_SIZE,
    DEFAULT_CONVERSATION_NAME,
    DEFAULT_DEVICE,
    DEFAULT_DTYPE,
    DEFAULT_HOME_GRAMMAR,
    DEFAULT_IDLE_UNLOAD_MIN,
    DEFAULT_KV_BUDGET_MIB,
    DEFAULT_MAX_HISTORY,
    DEFAULT_MAX_MODEL_LEN,
    DEFAULT_MAX_NUM_SEQS,
    DEFAULT_MAX_TOKENS,
    DEFAULT_SERVER_URL,
    DEFAULT_TEMPERATURE,
    DEFAULT_THINK,
    DEFAULT_TIMEOUT_S,
    DEFAULT_WEIGHTS,
    DEVICES,
    DTYPES,
    KV_BUDGET_AUTO,
    MAX_KV_BUDGET_MIB,
    MAX_MAX_TOKENS,
    MODEL_BUNDLED,
    MODEL_OTHER,
    SUBENTRY_AI_TASK,
    SUBENTRY_CONVERSATION,
    WEIGHTS,
)
from .picker import recommended_key
from .prompt import DEFAULT_INSTRUCTIONS

ENGINE_DEFAULTS: dict[str, Any] = {
    CONF_MODEL: DEFAULT_MODEL,
    CONF_DEVICE: DEFAULT_DEVICE,
    CONF_DTYPE: DEFAULT_DTYPE,
    CONF_WEIGHTS: DEFAULT_WEIGHTS,
    CONF_KV_BUDGET_MIB: DEFAULT_KV_BUDGET_MIB,
    CONF_BLOCK_SIZE: str(DEFAULT_BLOCK_SIZE),
    CONF_MAX_NUM_SEQS: DEFAULT_MAX_NUM_SEQS,
    CONF_MAX_MODEL_LEN: DEFAULT_MAX_MODEL_LEN,
    CONF_IDLE_UNLOAD_MIN: DEFAULT_IDLE_UNLOAD_MIN,
}


def backend_schema(options: list[str]) -> probatio.Schema:
    """The first form: where the model runs, from ``options`` (the first one chosen)."""
    return probatio.Schema(
        {
            probatio.Required(CONF_BACKEND, default=options[0]): SelectSelector(
                SelectSelectorConfig(
                    options=options,
                    translation_key=CONF_BACKEND,
                    mode=SelectSelectorMode.LIST,
                )
            )
        }
    )


def engine_schema(
    defaults: Mapping[str, Any],
    with_model: bool,
    recommended: list[SelectOptionDict] | None = None,
) -> probatio.Schema:
    """The engine settings form; the model is fixed once an entry exists (one entry per model).

    ``recommended``: the picker's files between the bundled model and "another file".
    """
    values = form_values(defaults)
    schema: dict[Any, Any] = {}
    if with_model:
        # A fixed list, not a combo box: the browser then shows the option's name, where a
        # combo box shows the raw value ("bundled:…") once something is chosen. The
        # translation names the bundled model and "another file"; the recommended files'
        # labels (sizes, memory, speed on this box) come as they are.
        options = [
            SelectOptionDict(value=MODEL_BUNDLED, label="SmolLM2 135M Instruct"),
            *(recommended or []),
            SelectOptionDict(value=MODEL_OTHER, label="Another file or model"),
        ]
        schema[probatio.Required(CONF_MODEL, default=values[CONF_MODEL])] = SelectSelector(
            SelectSelectorConfig(
                options=options,
                translation_key=CONF_MODEL,
                mode=SelectSelectorMode.DROPDOWN,
            )
        )
        schema[
            probatio.Optional(
                CONF_CUSTOM_MODEL, description={"suggested_value": values[CONF_CUSTOM_MODEL]}
            )
        ] = TextSelector()
    schema.update(
        {
            probatio.Required(CONF_DEVICE, default=values[CONF_DEVICE]): SelectSelector(
                SelectSelectorConfig(
                    options=list(DEVICES),
                    translation_key=CONF_DEVICE,
                    mode=SelectSelectorMode.DROPDOWN,
                )
            ),
            probatio.Required(CONF_DTYPE, default=values[CONF_DTYPE]): SelectSelector(
                SelectSelectorConfig(
                    options=list(DTYPES),
                    translation_key=CONF_DTYPE,
                    mode=SelectSelectorMode.DROPDOWN,
                )
            ),
            probatio.Required(CONF_WEIGHTS, default=values[CONF_WEIGHTS]): SelectSelector(
                SelectSelectorConfig(
                    options=list(WEIGHTS),
                    translation_key=CONF_WEIGHTS,
                    mode=SelectSelectorMode.DROPDOWN,
                )
            ),
            probatio.Required(
                CONF_KV_BUDGET_MIB, default=values[CONF_KV_BUDGET_MIB]
            ): NumberSelector(
                NumberSelectorConfig(
                    min=KV_BUDGET_AUTO,
                    max=MAX_KV_BUDGET_MIB,
                    step=1,
                    unit_of_measurement="MiB",
                    mode=NumberSelectorMode.BOX,
                )
            ),
            probatio.Required(CONF_BLOCK_SIZE, default=values[CONF_BLOCK_SIZE]): SelectSelector(
                SelectSelectorConfig(
                    options=[str(size) for size in BLOCK_SIZES],
                    mode=SelectSelectorMode.DROPDOWN,
                )
            ),
            probatio.Required(CONF_MAX_NUM_SEQS, default=values[CONF_MAX_NUM_SEQS]): NumberSelector(
                NumberSelectorConfig(min=1, max=1024, step=1, mode=NumberSelectorMode.BOX)
            ),
            probatio.Required(
                CONF_MAX_MODEL_LEN, default=values[CONF_MAX_MODEL_LEN]
            ): NumberSelector(
                NumberSelectorConfig(min=0, max=2**20, step=1, mode=NumberSelectorMode.BOX)
            ),
            probatio.Required(
                CONF_IDLE_UNLOAD_MIN, default=values[CONF_IDLE_UNLOAD_MIN]
            ): NumberSelector(
                NumberSelectorConfig(
                    min=0,
                    max=24 * 60,
                    step=1,
                    unit_of_measurement="min",
                    mode=NumberSelectorMode.BOX,
                )
            ),
        }
    )
    return probatio.Schema(schema)


def form_values(data: Mapping[str, Any]) -> dict[str, Any]:
    """Entry data as the form shows it (selects of strings; the model split in two fields)."""
    values = {**ENGINE_DEFAULTS, **data}
    # An automatic budget is saved sized for its model; the form shows it as chosen: 0.
    if values.pop(CONF_KV_BUDGET_AUTO, False):
        values[CONF_KV_BUDGET_MIB] = KV_BUDGET_AUTO
    values[CONF_BLOCK_SIZE] = str(values[CONF_BLOCK_SIZE])
    model = values[CONF_MODEL]
    if model in BY_KEY:  # a form sent back with a recommended file chosen
        values[CONF_CUSTOM_MODEL] = data.get(CONF_CUSTOM_MODEL, "")
        return values
    if (key := recommended_key(model)) is not None:  # a recommended file, downloaded
        values[CONF_MODEL], values[CONF_CUSTOM_MODEL] = key, ""
        return values
    values[CONF_MODEL] = MODEL_BUNDLED if model == DEFAULT_MODEL else MODEL_OTHER
    values[CONF_CUSTOM_MODEL] = "" if model == DEFAULT_MODEL else model
    return values


def server_schema(defaults: Mapping[str, Any]) -> probatio.Schema:
    """The server form: where it is, its key, how long to wait for it."""
    return probatio.Schema(
        {
            probatio.Required(
                CONF_URL, default=defaults.get(CONF_URL, DEFAULT_SERVER_URL)
            ): TextSelector(TextSelectorConfig(type=TextSelectorType.URL)),
            probatio.Optional(
                CONF_API_KEY, description={"suggested_value": defaults.get(CONF_API_KEY)}
            ): TextSelector(TextSelectorConfig(type=TextSelectorType.PASSWORD)),
            probatio.Required(
                CONF_TIMEOUT, default=defaults.get(CONF_TIMEOUT, DEFAULT_TIMEOUT_S)
            ): NumberSelector(
                NumberSelectorConfig(
                    min=1, max=3600, step=1, unit_of_measurement="s", mode=NumberSelectorMode.BOX
                )
            ),
        }
    )


def server_model_schema(models: list[str], current: str | None) -> probatio.Schema:
    """The server's models to pick from; ``current`` chosen while the server has it."""
    return probatio.Schema(
        {
            probatio.Required(
                CONF_MODEL,
                default=current if current in models else models[0],
            ): SelectSelector(
                SelectSelectorConfig(options=models, mode=SelectSelectorMode.DROPDOWN)
            )
        }
    )


def reauth_schema() -> probatio.Schema:
    """The server's new API key (none: the server wants no key now)."""
    return probatio.Schema(
        {
            probatio.Optional(CONF_API_KEY): TextSelector(
                TextSelectorConfig(type=TextSelectorType.PASSWORD)
            )
        }
    )


def unique_name(base: str, taken: Collection[str]) -> str:
    """``base``, or ``base 2``, ``base 3``... whichever no other agent of the entry has."""
    name, number = base, 1
    while name in taken:
        number += 1
        name = f"{base} {number}"
    return name


def agent_option_schema(
    hass: HomeAssistant,
    is_new: bool,
    subentry_type: str,
    options: Mapping[str, Any],
    taken: Collection[str] = (),
) -> dict[Any, Any]:
    """The agent form: prompt and tools for conversations; sampling and history for both."""
    schema: dict[Any, Any] = {}
    if is_new:
        default_name = unique_name(
            DEFAULT_AI_TASK_NAME
            if subentry_type == SUBENTRY_AI_TASK
            else DEFAULT_CONVERSATION_NAME,
            taken,
        )
        schema[probatio.Required(CONF_NAME, default=default_name)] = str
    if subentry_type == SUBENTRY_CONVERSATION:
        apis = llm.async_get_apis(hass)
        known = {api.id for api in apis}
        selected = [api for api in options.get(CONF_LLM_HASS_API, []) if api in known]
        schema.update(
            {
                probatio.Optional(
                    CONF_PROMPT,
                    description={"suggested_value": options.get(CONF_PROMPT, DEFAULT_INSTRUCTIONS)},
                ): TemplateSelector(),
                probatio.Optional(
                    CONF_LLM_HASS_API, description={"suggested_value": selected}
                ): SelectSelector(
                    SelectSelectorConfig(
                        options=[SelectOptionDict(label=api.name, value=api.id) for api in apis],
                        multiple=True,
                    )
                ),
                probatio.Optional(
                    CONF_HOME_GRAMMAR,
                    description={
                        "suggested_value": options.get(CONF_HOME_GRAMMAR, DEFAULT_HOME_GRAMMAR)
                    },
                ): BooleanSelector(),
                probatio.Optional(
                    CONF_THINK,
                    description={"suggested_value": options.get(CONF_THINK, DEFAULT_THINK)},
                ): BooleanSelector(),
            }
        )
    schema.update(
        {
            probatio.Optional(
                CONF_MAX_TOKENS,
                description={"suggested_value": options.get(CONF_MAX_TOKENS, DEFAULT_MAX_TOKENS)},
            ): NumberSelector(
                NumberSelectorConfig(min=1, max=MAX_MAX_TOKENS, step=1, mode=NumberSelectorMode.BOX)
            ),
            probatio.Optional(
                CONF_TEMPERATURE,
                description={"suggested_value": options.get(CONF_TEMPERATURE, DEFAULT_TEMPERATURE)},
            ): NumberSelector(
                NumberSelectorConfig(min=0, max=2, step=0.05, mode=NumberSelectorMode.SLIDER)
            ),
        }
    )
    if subentry_type == SUBENTRY_CONVERSATION:
        schema[
            probatio.Optional(
                CONF_MAX_HISTORY,
                description={"suggested_value": options.get(CONF_MAX_HISTORY, DEFAULT_MAX_HISTORY)},
            )
        ] = NumberSelector(
            NumberSelectorConfig(min=0, max=1000, step=1, mode=NumberSelectorMode.BOX)
        )
    return schema
