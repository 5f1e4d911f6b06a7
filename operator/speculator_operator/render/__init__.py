"""Pure builders of every child object and of the vLLM / speculators command lines per pinned release."""
