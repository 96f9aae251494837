"""Constants for the Paged LLM integration."""

from __future__ import annotations

import logging
from typing import Final

from paged_llm.defaults import WEIGHT_CHOICES
from paged_llm.protocol.priority import PRIORITY_NAMES, Priority

DOMAIN: Final = "paged_llm"
LOGGER = logging.getLogger(__package__)

DEFAULT_TITLE: Final = "Paged LLM"

# Where the model runs, kept in the config entry's data.
CONF_BACKEND: Final = "backend"
BACKEND_EMBEDDED: Final = "embedded"
BACKEND_REMOTE: Final = "remote"
BACKENDS: Final = (BACKEND_EMBEDDED, BACKEND_REMOTE)
# Server settings: besides these, url, api_key, model and timeout from homeassistant.const.
DEFAULT_SERVER_URL: Final = "http://127.0.0.1:8000"
DEFAULT_TIMEOUT_S: Final = 60
# How often the sensors of a server entry read its /metrics.
REMOTE_METRICS_INTERVAL_S: Final = 5

# Engine settings, kept in the config entry's data.
CONF_DTYPE: Final = "dtype"
CONF_KV_BUDGET_MIB: Final = "kv_budget_mib"
CONF_BLOCK_SIZE: Final = "block_size"
CONF_MAX_NUM_SEQS: Final = "max_num_seqs"
CONF_MAX_MODEL_LEN: Final = "max_model_len"
# Minutes without requests before the model is unloaded (0: never).
CONF_IDLE_UNLOAD_MIN: Final = "idle_unload_minutes"
DEFAULT_IDLE_UNLOAD_MIN: Final = 0

# The engine form picks the model in two fields: a select (the bundled model or another
# one) and, for another one, a text field with its folder, .gguf file or Hugging Face id.
CONF_CUSTOM_MODEL: Final = "custom_model"
MODEL_BUNDLED: Final = "bundled"
MODEL_OTHER: Final = "other"

CONF_WEIGHTS: Final = "weights"
WEIGHTS: Final = WEIGHT_CHOICES
DEFAULT_WEIGHTS: Final = "auto"

DEVICES: Final = ("auto", "cpu", "cuda")
DTYPES: Final = ("auto", "float32", "bfloat16", "float16")
BLOCK_SIZES: Final = (8, 16, 32, 64, 128)

DEFAULT_DEVICE: Final = "auto"
DEFAULT_DTYPE: Final = "auto"
# The form's KV budget 0: automatic, the budget follows the chosen model (picker.py's
# auto_kv_budget_mib: 4,096 tokens of its KV, at least 512 MiB, within the memory free).
# Saved resolved, with CONF_KV_BUDGET_AUTO set, so the engine gets a number and a new model
# chosen later is sized again.
KV_BUDGET_AUTO: Final = 0
DEFAULT_KV_BUDGET_MIB: Final = KV_BUDGET_AUTO
CONF_KV_BUDGET_AUTO: Final = "kv_budget_auto"
# Where data hold no resolved budget: the automatic budget's floor, enough for one full
# 8,192-token SmolLM2 sequence in float32 plus room to share.
FALLBACK_KV_BUDGET_MIB: Final = 512
DEFAULT_BLOCK_SIZE: Final = 16
DEFAULT_MAX_NUM_SEQS: Final = 32
# 0 means the model's own context length.
DEFAULT_MAX_MODEL_LEN: Final = 0
MAX_KV_BUDGET_MIB: Final = 1024 * 1024

# Agent settings, kept in each subentry's data.
CONF_MAX_TOKENS: Final = "max_tokens"
CONF_TEMPERATURE: Final = "temperature"
CONF_MAX_HISTORY: Final = "max_history"
# Hold Assist tools' targets (names, areas, floors...) to what exists in the home.
CONF_HOME_GRAMMAR: Final = "home_grammar"
# Let a reasoning model (a chat template with enable_thinking, as Qwen3's) think first.
CONF_THINK: Final = "think"

DEFAULT_MAX_TOKENS: Final = 256
DEFAULT_TEMPERATURE: Final = 0.7
DEFAULT_MAX_HISTORY: Final = 20
DEFAULT_HOME_GRAMMAR: Final = True
DEFAULT_THINK: Final = False  # a voice answer should not wait on reasoning nobody hears
MAX_MAX_TOKENS: Final = 32768

SUBENTRY_CONVERSATION: Final = "conversation"
SUBENTRY_AI_TASK: Final = "ai_task_data"
DEFAULT_CONVERSATION_NAME: Final = "Paged LLM Conversation"
DEFAULT_AI_TASK_NAME: Final = "Paged LLM AI Task"

# A conversation agent whose prompt, read without the cache (after a restart, or once the
# exposed entities change), is predicted to keep a person waiting longer than this for the
# first word gets a Repairs issue.
PROMPT_SLOW_S: Final = 10.0

# The model may ask for tools again after each result; stop a runaway loop.
MAX_TOOL_ITERATIONS: Final = 10

# Actions.
SERVICE_GENERATE: Final = "generate"
SERVICE_SUMMARIZE: Final = "summarize"
# Fired as a summary's parts finish: entry_id, round, parts_done, parts_total (with the
# calling action's context, so an automation can follow its own summary).
EVENT_SUMMARY_PROGRESS: Final = "paged_llm_summary_progress"
ATTR_CONFIG_ENTRY_ID: Final = "config_entry_id"
ATTR_PROMPT: Final = "prompt"
ATTR_SYSTEM_PROMPT: Final = "system_prompt"
ATTR_PRIORITY: Final = "priority"
ATTR_MAX_TOKENS: Final = "max_tokens"
ATTR_TEMPERATURE: Final = "temperature"
ATTR_TEXT: Final = "text"
ATTR_PATH: Final = "path"
# The engine's request classes, most urgent first, by the names the library gives them.
PRIORITIES: Final = PRIORITY_NAMES
DEFAULT_SERVICE_PRIORITY: Final = "automation"
DEFAULT_SUMMARY_MAX_TOKENS: Final = 512
ATTR_REPETITION_PENALTY: Final = "repetition_penalty"
# Small models loop on long summaries without it; 1.1 is llama.cpp's and Ollama's default.
DEFAULT_SUMMARY_REPETITION_PENALTY: Final = 1.1
# Structured answers (AI tasks with a structure): held to a JSON grammar, a small model can
# loop inside a list or a string until max_tokens ("1", "2", "3", … or "blue", "blueblue", …).
# A frequency penalty counts only the answer's own tokens, not the prompt's schema, so short
# answers hardly change while a loop ends: with the bundled model, more structures come out
# valid with it than without (benchmarks/structured.py measures it). A repetition penalty,
# which counts the prompt too, garbled numbers and names instead.
STRUCTURE_FREQUENCY_PENALTY: Final = 0.5
# A part's own summary is not what the user sized with max_tokens: give it room enough.
SUMMARY_PART_MAX_TOKENS: Final = 512
# Files beyond this are refused rather than read into memory whole.
MAX_SUMMARY_FILE_BYTES: Final = 8 * 1024 * 1024
# Chunk summaries of one long document in flight at once; the rest wait their turn here
# instead of filling the engine's queue.
SUMMARY_CHUNK_CONCURRENCY: Final = 4
SUMMARY_PROMPT: Final = (
    "Summarize the following text. Keep the key facts, names, numbers and decisions; "
    "leave out repetition. Answer with the summary only."
)
SUMMARY_COMBINE_PROMPT: Final = (
    "The following are summaries of consecutive parts of one document. Combine them into "
    "one summary of the whole document. Answer with the summary only."
)

# Which class each kind of request runs in.
PRIORITY_CONVERSATION: Final = Priority.INTERACTIVE.label
PRIORITY_AI_TASK: Final = Priority.AUTOMATION.label
PRIORITY_SUMMARY: Final = Priority.BACKGROUND.label
