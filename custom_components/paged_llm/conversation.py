"""Conversation agents that answer with the local model, streaming, with Assist tools."""

from __future__ import annotations

from typing import Any, Literal, override

from homeassistant.components import conversation
from homeassistant.components.conversation.models import AbstractConversationAgent
from homeassistant.config_entries import ConfigSubentry
from homeassistant.const import CONF_LLM_HASS_API, CONF_PROMPT, MATCH_ALL
from homeassistant.core import Event, HomeAssistant, callback
from homeassistant.helpers import area_registry as ar
from homeassistant.helpers import entity_registry as er
from homeassistant.helpers.debounce import Debouncer
from homeassistant.helpers.entity_platform import AddConfigEntryEntitiesCallback

from .const import DOMAIN, LOGGER, PRIORITY_CONVERSATION, SUBENTRY_CONVERSATION
from .entity import PagedLLMBaseLLMEntity
from .prompt import agent_instructions
from .prompt_budget import async_clear_budget, async_publish_budget
from .runtime import PagedLLMConfigEntry
from .warmup import async_warm_prefix

# The engine queues and prioritises requests itself; Home Assistant need not limit them.
PARALLEL_UPDATES = 0
# Registry changes come in bursts (an area renamed, entities exposed): warm once after.
WARMUP_COOLDOWN = 10.0


async def async_setup_entry(
    hass: HomeAssistant,
    config_entry: PagedLLMConfigEntry,
    async_add_entities: AddConfigEntryEntitiesCallback,
) -> None:
    """Add one conversation entity per conversation subentry."""
    for subentry in config_entry.subentries.values():
        if subentry.subentry_type != SUBENTRY_CONVERSATION:
            continue
        async_add_entities(
            [PagedLLMConversationEntity(config_entry, subentry)],
            config_subentry_id=subentry.subentry_id,
        )


class PagedLLMConversationEntity(
    conversation.ConversationEntity,
    AbstractConversationAgent,
    PagedLLMBaseLLMEntity,
):
    """A conversation agent; its requests are interactive, served before everything else."""

    _attr_supports_streaming = True
    _priority = PRIORITY_CONVERSATION

    def __init__(self, entry: PagedLLMConfigEntry, subentry: ConfigSubentry) -> None:
        """Offer device control when an LLM API is selected."""
        super().__init__(entry, subentry)
        if self.subentry.data.get(CONF_LLM_HASS_API):
            self._attr_supported_features = conversation.ConversationEntityFeature.CONTROL

    @override
    async def async_added_to_hass(self) -> None:
        """Register as a conversation agent and warm the prefix cache with its prompt."""
        await super().async_added_to_hass()
        conversation.async_set_agent(self.hass, self.entry, self)
        self._warmed: str | None = None
        self._removed = False
        self._warmer = Debouncer(
            self.hass,
            LOGGER,
            cooldown=WARMUP_COOLDOWN,
            immediate=True,
            function=self._async_warm,
            background=True,
        )
        self.async_on_remove(self._warmer.async_shutdown)

        @callback
        def _prompt_may_change(_event: Event[Any]) -> None:
            """Warm the prompt again: an entity or area it may list changed."""
            self._warmer.async_schedule_call()

        bus = self.hass.bus
        self.async_on_remove(bus.async_listen(er.EVENT_ENTITY_REGISTRY_UPDATED, _prompt_may_change))
        self.async_on_remove(bus.async_listen(ar.EVENT_AREA_REGISTRY_UPDATED, _prompt_may_change))
        self._warmer.async_schedule_call()

    async def _async_warm(self) -> None:
        """Prefill the agent's system prompt when it differs from the one warmed last.

        Its new budget goes to the agent's sensor and Repairs, unless the agent was removed
        meanwhile (a warm-up in flight must not raise an issue nobody would clear).
        """
        self._warmed, budget = await async_warm_prefix(
            self.hass, self.entry, self.subentry.data, self._warmed
        )
        if budget is not None and not self._removed:
            async_publish_budget(self.hass, self.entry, self.subentry, budget)

    @override
    async def async_will_remove_from_hass(self) -> None:
        """Unregister the agent; its budget and issues go with it (a reload makes new ones)."""
        self._removed = True
        conversation.async_unset_agent(self.hass, self.entry)
        async_clear_budget(self.hass, self.entry, self.subentry.subentry_id)
        await super().async_will_remove_from_hass()

    @property
    @override
    def supported_languages(self) -> list[str] | Literal["*"]:
        """Any language the model knows."""
        return MATCH_ALL

    @override
    async def _async_handle_message(
        self,
        user_input: conversation.ConversationInput,
        chat_log: conversation.ChatLog,
    ) -> conversation.ConversationResult:
        """Answer one user turn, with the history the chat log keeps."""
        settings = self.subentry.data
        try:
            await chat_log.async_provide_llm_data(
                user_input.as_llm_context(DOMAIN),
                settings.get(CONF_LLM_HASS_API),
                agent_instructions(
                    settings.get(CONF_PROMPT), bool(settings.get(CONF_LLM_HASS_API))
                ),
                user_input.extra_system_prompt,
            )
        except conversation.ConverseError as err:
            return err.as_conversation_result()

        await self._async_handle_chat_log(chat_log)
        return conversation.async_get_result_from_chat_log(user_input, chat_log)
