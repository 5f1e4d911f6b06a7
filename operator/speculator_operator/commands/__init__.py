"""Sub-commands of `speculator-operator` that have outgrown cli.py, one module each (cli.py wires them)."""
