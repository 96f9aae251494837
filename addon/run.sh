#!/bin/sh
# The add-on's run script: the Python program (paged_llm_addon/run.py) checks the options,
# fetches the model, then runs and watches `paged-llm serve` and announces it.
export PYTHONPATH=/opt/paged-llm-addon
exec python3 -m paged_llm_addon "$@"
