"""speculator-operator: a Kubernetes operator for speculative-decoding draft models served by vLLM."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("speculator-operator")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0+unknown"

__all__ = ["__version__"]
