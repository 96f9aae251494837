"""``python -m paged_llm_addon``: what the add-on's run script starts."""

from paged_llm_addon.run import main

if __name__ == "__main__":
    raise SystemExit(main())
