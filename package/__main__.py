"""``python -m paged_llm``: the ``paged-llm`` command."""

from paged_llm.server.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
