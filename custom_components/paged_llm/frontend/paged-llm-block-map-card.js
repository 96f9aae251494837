// The Paged LLM block-map card: every KV block of the engine's pool, coloured by who holds it.
// Loaded by the integration as an extra frontend module; fed by the websocket subscription
// `paged_llm/block_map/subscribe`, which pushes at most twice a second while a card is open.

const CARD_TYPE = "paged-llm-block-map-card";
const EDITOR_TYPE = "paged-llm-block-map-card-editor";
const VERSION = "0.1.0";

// Cell byte: the low three bits are the state, bit 3 marks a block shared by several sequences.
const SHARED = 0x08;
const STATES = [
  { key: "free", label: "Free" },
  { key: "cached", label: "Cached prefix" },
  { key: "interactive", label: "Interactive" },
  { key: "automation", label: "Automation" },
  { key: "background", label: "Background" },
];

// Colours per theme; the free and cached cells follow the theme's own greys.
const PALETTES = {
  light: {
    free: "#e3e6ea",
    cached: "#9bd3b0",
    interactive: "#1e88e5",
    automation: "#f9a825",
    background: "#8e24aa",
    shared: "#ffffff",
  },
  dark: {
    free: "#2c3036",
    cached: "#2e7d52",
    interactive: "#64b5f6",
    automation: "#ffd54f",
    background: "#ce93d8",
    shared: "#111111",
  },
};

const SIZES = { small: 6, medium: 10, large: 16 };

function decodeCells(b64) {
  const raw = atob(b64);
  const cells = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i += 1) cells[i] = raw.charCodeAt(i);
  return cells;
}

function percent(value) {
  return `${(value * 100).toFixed(1)} %`;
}

class PagedLlmBlockMapCard extends HTMLElement {
  constructor() {
    super();
    this.attachShadow({ mode: "open" });
    this._config = { size: "medium" };
    this._hass = null;
    this._payload = null;
    this._cells = null;
    this._unsubscribe = null;
    this._subscribing = false;
    this._resize = new ResizeObserver(() => this._draw());
    this._build();
  }

  static getConfigElement() {
    return document.createElement(EDITOR_TYPE);
  }

  static getStubConfig() {
    return { type: `custom:${CARD_TYPE}`, size: "medium" };
  }

  setConfig(config) {
    if (!config) throw new Error("Invalid configuration");
    if (config.size !== undefined && !(config.size in SIZES) && !Number.isFinite(config.size)) {
      throw new Error("size must be small, medium, large or a number of pixels");
    }
    const changedEntry = this._config.entry_id !== config.entry_id;
    this._config = { size: "medium", ...config };
    this._title.textContent = this._config.title || "KV cache blocks";
    if (changedEntry) this._resubscribe();
    this._draw();
  }

  set hass(hass) {
    const first = !this._hass;
    const dark = hass.themes && hass.themes.darkMode;
    const themeChanged = this._hass && this._hass.themes && this._hass.themes.darkMode !== dark;
    this._hass = hass;
    if (first) this._subscribe();
    if (themeChanged) this._draw();
  }

  getCardSize() {
    return 5;
  }

  getGridOptions() {
    return { columns: 12, min_columns: 6, rows: "auto" };
  }

  connectedCallback() {
    this._resize.observe(this._grid);
    this._subscribe();
  }

  disconnectedCallback() {
    this._resize.disconnect();
    this._unsubscribeNow();
  }

  get payload() {
    return this._payload;
  }

  _build() {
    this.shadowRoot.innerHTML = `
      <style>
        ha-card { padding: 12px 16px 16px; }
        .header { display: flex; justify-content: space-between; align-items: baseline; }
        .title { font-size: 1.2em; color: var(--primary-text-color); }
        .status { font-size: 0.85em; color: var(--secondary-text-color); }
        .figures { display: flex; flex-wrap: wrap; gap: 4px 16px; margin: 8px 0; }
        .figure { display: flex; flex-direction: column; min-width: 64px; }
        .figure .value { font-size: 1.3em; color: var(--primary-text-color); }
        .figure .name { font-size: 0.8em; color: var(--secondary-text-color); }
        .grid { width: 100%; }
        canvas { display: block; }
        .bar { height: 16px; border-radius: 4px; overflow: hidden; display: flex;
               background: var(--divider-color, #ccc); }
        .note { font-size: 0.85em; color: var(--secondary-text-color); margin-top: 6px; }
        .legend { display: flex; flex-wrap: wrap; gap: 4px 14px; margin-top: 10px;
                  font-size: 0.9em; color: var(--primary-text-color); }
        .legend .item { display: flex; align-items: center; gap: 6px; }
        .legend .swatch { width: 12px; height: 12px; border-radius: 2px;
                          box-sizing: border-box; }
        .legend .count { font-variant-numeric: tabular-nums; color: var(--secondary-text-color); }
        [hidden] { display: none !important; }
      </style>
      <ha-card>
        <div class="header"><div class="title"></div><div class="status"></div></div>
        <div class="figures"></div>
        <div class="grid"><canvas role="img" aria-label="KV cache block map"></canvas></div>
        <div class="bar" hidden></div>
        <div class="note" hidden></div>
        <div class="legend"></div>
      </ha-card>`;
    const root = this.shadowRoot;
    this._title = root.querySelector(".title");
    this._status = root.querySelector(".status");
    this._figures = root.querySelector(".figures");
    this._grid = root.querySelector(".grid");
    this._canvas = root.querySelector("canvas");
    this._bar = root.querySelector(".bar");
    this._note = root.querySelector(".note");
    this._legend = root.querySelector(".legend");
    this._title.textContent = "KV cache blocks";
    this._status.textContent = "connecting…";
  }

  async _subscribe() {
    if (!this._hass || !this.isConnected || this._unsubscribe || this._subscribing) return;
    this._subscribing = true;
    const message = { type: "paged_llm/block_map/subscribe" };
    if (this._config.entry_id) message.entry_id = this._config.entry_id;
    try {
      this._unsubscribe = await this._hass.connection.subscribeMessage(
        (payload) => this._update(payload),
        message,
      );
      if (!this.isConnected) this._unsubscribeNow();
    } catch (err) {
      this._status.textContent = err && err.message ? err.message : "no Paged LLM entry";
    } finally {
      this._subscribing = false;
    }
  }

  _unsubscribeNow() {
    if (this._unsubscribe) {
      const unsubscribe = this._unsubscribe;
      this._unsubscribe = null;
      unsubscribe().catch(() => {});
    }
  }

  _resubscribe() {
    this._unsubscribeNow();
    this._payload = null;
    this._cells = null;
    this._subscribe();
  }

  _palette() {
    const dark = this._hass && this._hass.themes && this._hass.themes.darkMode;
    return PALETTES[dark ? "dark" : "light"];
  }

  _update(payload) {
    this._payload = payload;
    this._cells = payload.block_map ? decodeCells(payload.block_map.cells) : null;
    if (payload.title && !this._config.title) this._title.textContent = payload.title;
    this._draw();
  }

  _figuresFor(payload) {
    const metrics = payload.metrics || {};
    const map = payload.block_map;
    const pick = (key) => (map && map[key] !== undefined ? map[key] : metrics[key]);
    const total = map ? map.num_blocks : metrics.kv_blocks_total;
    const used = map ? map.used : metrics.kv_blocks_used;
    return [
      ["running", "Running", pick("num_requests_running")],
      ["waiting", "Waiting", pick("num_requests_waiting")],
      ["preemptions", "Preemptions", pick("num_preemptions")],
      ["usage", "KV usage", total ? percent(used / total) : "–"],
      ["blocks", "Blocks used", total !== undefined ? `${used} / ${total}` : "–"],
    ];
  }

  _draw() {
    const payload = this._payload;
    if (!payload) return;
    if (payload.state !== "loaded") {
      this._status.textContent = payload.state === "removed" ? "entry removed" : "unavailable";
      return;
    }
    const map = payload.block_map;
    this._status.textContent = map
      ? `${map.num_blocks} blocks × ${map.block_size} tokens`
      : "aggregate figures";
    this._figures.innerHTML = "";
    for (const [key, name, value] of this._figuresFor(payload)) {
      const figure = document.createElement("div");
      figure.className = "figure";
      figure.dataset.key = key;
      figure.innerHTML = `<span class="value"></span><span class="name"></span>`;
      figure.querySelector(".value").textContent = value === undefined ? "–" : String(value);
      figure.querySelector(".name").textContent = name;
      this._figures.appendChild(figure);
    }
    const palette = this._palette();
    if (map && this._cells) {
      this._canvas.hidden = false;
      this._bar.hidden = true;
      this._note.hidden = true;
      this._paint(this._cells, palette);
      this._drawLegend(palette, map);
    } else {
      this._canvas.hidden = true;
      this._paintBar(payload.metrics || {}, palette);
    }
  }

  _cellSize() {
    const size = this._config.size;
    return Number.isFinite(size) ? Math.max(2, Math.min(40, size)) : SIZES[size] || SIZES.medium;
  }

  _paint(cells, palette) {
    const cell = this._cellSize();
    const gap = cell >= 6 ? 1 : 0;
    const pitch = cell + gap;
    const width = Math.max(pitch, this._grid.clientWidth || 300);
    const columns = Math.max(1, Math.floor((width + gap) / pitch));
    const rows = Math.ceil(cells.length / columns);
    const ratio = window.devicePixelRatio || 1;
    const canvas = this._canvas;
    const cssWidth = columns * pitch - gap;
    const cssHeight = Math.max(0, rows * pitch - gap);
    canvas.style.width = `${cssWidth}px`;
    canvas.style.height = `${cssHeight}px`;
    canvas.width = Math.round(cssWidth * ratio);
    canvas.height = Math.round(cssHeight * ratio);
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, cssWidth, cssHeight);
    const colours = STATES.map((s) => palette[s.key]);
    for (let i = 0; i < cells.length; i += 1) {
      const value = cells[i];
      const x = (i % columns) * pitch;
      const y = Math.floor(i / columns) * pitch;
      ctx.fillStyle = colours[value & 0x07] || palette.free;
      ctx.fillRect(x, y, cell, cell);
      if (value & SHARED) {
        // A shared prefix block: a dot in the middle, in the card's contrast colour.
        ctx.fillStyle = palette.shared;
        const dot = Math.max(1, Math.floor(cell / 3));
        ctx.fillRect(x + (cell - dot) / 2, y + (cell - dot) / 2, dot, dot);
      }
    }
  }

  _paintBar(metrics, palette) {
    const total = metrics.kv_blocks_total || 0;
    const used = metrics.kv_blocks_used || 0;
    this._bar.hidden = false;
    this._bar.innerHTML = "";
    const fill = document.createElement("div");
    fill.style.width = total ? `${(100 * used) / total}%` : "0";
    fill.style.background = palette.interactive;
    this._bar.appendChild(fill);
    this._note.hidden = false;
    this._note.textContent =
      "This server reports totals only, not its block map: shown as one bar.";
    this._legend.innerHTML = "";
    this._legendItem("used", "Used", palette.interactive, used);
    this._legendItem("free", "Free", palette.free, Math.max(0, total - used));
  }

  _drawLegend(palette, map) {
    this._legend.innerHTML = "";
    const byClass = map.used_by_class || {};
    for (const state of STATES.slice(2)) {
      this._legendItem(state.key, state.label, palette[state.key], byClass[state.key] || 0);
    }
    this._legendItem("shared", "Shared", palette.interactive, map.shared, palette.shared);
    this._legendItem("cached", "Cached prefix", palette.cached, map.cached);
    this._legendItem("free", "Free", palette.free, map.free);
  }

  _legendItem(key, label, colour, count, dot) {
    const item = document.createElement("div");
    item.className = "item";
    item.dataset.key = key;
    const swatch = document.createElement("span");
    swatch.className = "swatch";
    swatch.style.background = dot
      ? `radial-gradient(circle, ${dot} 0 25%, ${colour} 30%)`
      : colour;
    const name = document.createElement("span");
    name.textContent = label;
    const value = document.createElement("span");
    value.className = "count";
    value.textContent = String(count);
    item.append(swatch, name, value);
    this._legend.appendChild(item);
  }
}

class PagedLlmBlockMapCardEditor extends HTMLElement {
  constructor() {
    super();
    this._config = {};
    this._hass = null;
  }

  setConfig(config) {
    this._config = config;
    this._render();
  }

  set hass(hass) {
    this._hass = hass;
    this._render();
  }

  _render() {
    if (!this._hass) return;
    if (!this._form) {
      this._form = document.createElement("ha-form");
      this._form.computeLabel = (schema) =>
        ({ entry_id: "Paged LLM entry", title: "Title", size: "Cell size" })[schema.name];
      this._form.addEventListener("value-changed", (ev) => {
        const config = { ...this._config, ...ev.detail.value };
        for (const key of Object.keys(config)) {
          if (config[key] === "" || config[key] === undefined) delete config[key];
        }
        this._config = config;
        this.dispatchEvent(
          new CustomEvent("config-changed", { detail: { config }, bubbles: true, composed: true }),
        );
      });
      this.appendChild(this._form);
    }
    this._form.hass = this._hass;
    this._form.data = this._config;
    this._form.schema = [
      { name: "entry_id", selector: { config_entry: { integration: "paged_llm" } } },
      { name: "title", selector: { text: {} } },
      {
        name: "size",
        selector: {
          select: {
            mode: "dropdown",
            options: [
              { value: "small", label: "Small" },
              { value: "medium", label: "Medium" },
              { value: "large", label: "Large" },
            ],
          },
        },
      },
    ];
  }
}

function defineCard() {
  if (customElements.get(CARD_TYPE)) return;
  customElements.define(CARD_TYPE, PagedLlmBlockMapCard);
  customElements.define(EDITOR_TYPE, PagedLlmBlockMapCardEditor);
  window.customCards = window.customCards || [];
  window.customCards.push({
    type: CARD_TYPE,
    name: "Paged LLM block map",
    description: "Every KV cache block of a Paged LLM engine, live, coloured by request class.",
    preview: false,
    documentationURL: "https://github.com/paged-llm/ha-paged-llm#the-block-map-card",
  });
  console.info(`%c PAGED-LLM-BLOCK-MAP-CARD %c ${VERSION} `, "color:white;background:#1e88e5", "");
}

// Home Assistant's app replaces window.customElements with a scoped-registry polyfill as it
// starts. This module can run first (extra modules load beside the app), and a card defined
// then lands in the browser's own registry, which the dashboard no longer reads: it showed
// "Configuration error" until a reload. The app's root element is defined after the swap
// (in either registry), so the card is defined then, in the registry the app uses.
customElements.whenDefined("home-assistant").then(defineCard);
