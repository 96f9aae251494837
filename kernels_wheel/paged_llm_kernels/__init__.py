"""Prebuilt C kernels for paged-llm: shared libraries and their manifest.json, nothing to import.

paged_llm.kernels.cpu.prebuilt finds this folder, checks a library against the manifest
(its sources, sha256 and the CPU features it needs) and loads it with ctypes.
"""
