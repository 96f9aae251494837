"""The CPU kernels: C sources built on this machine and their Python bindings."""
