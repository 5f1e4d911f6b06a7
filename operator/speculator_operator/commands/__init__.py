"""Sub-commands of `speculator-operator` that have outgrown cli.py, one module each (cli.py wires them); usage.py
holds UsageError, the bad-usage error they raise and cli.py prints."""
