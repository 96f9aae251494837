"""AI task agents: text, or JSON checked against the task's structure, for automations."""

from __future__ import annotations

import json
import re
from typing import Any, override

import probatio
from homeassistant.components import ai_task, conversation
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import HomeAssistantError
from homeassistant.helpers.entity_platform import AddConfigEntryEntitiesCallback

from .const import DOMAIN, LOGGER, PRIORITY_AI_TASK, SUBENTRY_AI_TASK
from .entity import PagedLLMBaseLLMEntity
from .evaluate import async_evaluate
from .runtime import PagedLLMConfigEntry

# The engine queues and prioritises requests itself; Home Assistant need not limit them.
PARALLEL_UPDATES = 0
_FENCE = re.compile(r"```(?:json)?\s*(.*?)\s*```", re.DOTALL | re.IGNORECASE)
# Shown in errors: enough to see what went wrong, not a whole essay.
_EXCERPT = 200


async def async_setup_entry(
    hass: HomeAssistant,
    config_entry: PagedLLMConfigEntry,
    async_add_entities: AddConfigEntryEntitiesCallback,
) -> None:
    """Add one AI task entity per AI task subentry."""
    for subentry in config_entry.subentries.values():
        if subentry.subentry_type != SUBENTRY_AI_TASK:
            continue
        async_add_entities(
            [PagedLLMTaskEntity(config_entry, subentry)],
            config_subentry_id=subentry.subentry_id,
        )


def _json_candidates(text: str) -> list[str]:
    """Where JSON may sit in an answer: all of it, a code fence, or the outermost braces."""
    candidates = [text.strip()]
    candidates.extend(match.group(1) for match in _FENCE.finditer(text))
    for open_, close in ("{}", "[]"):
        start, end = text.find(open_), text.rfind(close)
        if 0 <= start < end:
            candidates.append(text[start : end + 1])
    return candidates


def parse_structured_output(text: str, structure: probatio.Schema, cut_off: bool = False) -> Any:
    """Parse the model's JSON answer and validate it against the task's structure.

    ``cut_off``: the answer ended at max_tokens; if it does not parse, say so.
    """
    excerpt = text.strip()[:_EXCERPT]
    for candidate in _json_candidates(text):
        try:
            data = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        break
    else:
        raise HomeAssistantError(
            translation_domain=DOMAIN,
            translation_key="structured_output_cut_off"
            if cut_off
            else "structured_output_not_json",
            translation_placeholders={"output": excerpt},
        )
    try:
        return structure(data)
    except probatio.Invalid as err:
        raise HomeAssistantError(
            translation_domain=DOMAIN,
            translation_key="structured_output_invalid",
            translation_placeholders={"error": str(err), "output": excerpt},
        ) from err


class PagedLLMTaskEntity(ai_task.AITaskEntity, PagedLLMBaseLLMEntity):
    """An AI task agent; its requests run in the automation class."""

    _priority = PRIORITY_AI_TASK

    @property
    @override
    def supported_features(self) -> ai_task.AITaskEntityFeature:
        """Data always; evaluate where the backend gives log probabilities (a server may not)."""
        features = ai_task.AITaskEntityFeature.GENERATE_DATA
        data = getattr(self.entry, "runtime_data", None)
        if data is not None and data.backend.can_evaluate:
            features |= ai_task.AITaskEntityFeature.EVALUATE
        return features

    @override
    async def _async_evaluate(self, task: ai_task.EvaluationTask) -> ai_task.EvaluationTaskResult:
        """Answer the questions from the model's probabilities, as automation work."""
        return await async_evaluate(self.hass, self.entry, task, self._priority)

    @override
    async def _async_generate_data(
        self,
        task: ai_task.GenDataTask,
        chat_log: conversation.ChatLog,
    ) -> ai_task.GenDataTaskResult:
        """Run the task; with a structure, decode JSON of its schema and check it."""
        finish = await self._async_handle_chat_log(chat_log, task.structure)
        last = chat_log.content[-1]
        if not isinstance(last, conversation.AssistantContent):
            raise HomeAssistantError(
                translation_domain=DOMAIN, translation_key="no_answer", translation_placeholders={}
            )
        text = last.content or ""
        if not task.structure:
            return ai_task.GenDataTaskResult(conversation_id=chat_log.conversation_id, data=text)
        try:
            data = parse_structured_output(text, task.structure, cut_off=finish == "length")
        except HomeAssistantError:
            LOGGER.warning("Task %s: the answer is not valid structured data: %s", task.name, text)
            raise
        return ai_task.GenDataTaskResult(conversation_id=chat_log.conversation_id, data=data)
