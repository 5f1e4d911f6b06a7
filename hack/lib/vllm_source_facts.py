"""Run inside a server image (its own Python, its own vLLM): the facts of that vLLM the operator's renderer, audit and
scrape rely on, read from the installed code, without a device. stdout: one JSON object:

  speculators_types   the speculators_model_type values vLLM registers, and for each whether its config updater
                      accepts a minimal config or refuses the type outright (P-EAGLE in 0.34)
  spec_config_fields  the fields of SpeculativeConfig (extra keys stop the server: the renderer's keys must be here)
  metrics             for each name given on the command line, whether the installed vLLM's source names it
  connectors          the KV connectors vLLM's factory registers by name (from its source)
  hs_connectors       for each hs-connectors connector class: the import result, and every method it defines that
                      its vLLM base class also defines that cannot take every call the base's signature allows
                      (the API it implements)
"""

from __future__ import annotations

import importlib
import inspect
import json
import pathlib
import sys
from typing import Any


def _speculators_types() -> dict[str, str]:
    from vllm.transformers_utils.configs.speculators import algos

    out = {}
    for name, update in sorted(algos.SUPPORTED_SPECULATORS_TYPES.items()):
        try:
            update({"transformer_layer_config": {}, "speculators_config": {}}, {})
            out[name] = "accepted"
        except (KeyError, TypeError, AttributeError, IndexError):
            out[name] = "accepted"  # it reads keys a minimal config lacks: the type itself is served
        except ValueError as exc:
            out[name] = f"refused: {exc}"
    return out


def _fields() -> list[str]:
    from vllm.config.speculative import SpeculativeConfig

    fields = getattr(SpeculativeConfig, "__dataclass_fields__", None) or getattr(SpeculativeConfig, "model_fields", {})
    return sorted(fields)


def _metrics(names: list[str]) -> dict[str, bool]:
    import vllm

    root = pathlib.Path(vllm.__file__).parent
    text = "\n".join(p.read_text(errors="replace") for p in root.rglob("*.py"))
    # a counter "vllm:x" is exported as vllm:x_total; the source names it without the suffix
    return {name: name.removesuffix("_total") in text for name in names}


def _connectors() -> list[str]:
    import re

    from vllm.distributed.kv_transfer.kv_connector import factory

    # the names factory.py registers (read from its source: the registry itself is private)
    return sorted(set(re.findall(r'register_connector\(\s*"(\w+)"', inspect.getsource(factory))))


def _params(fn: Any) -> list[str]:
    try:
        return [p.name for p in inspect.signature(fn).parameters.values()]
    except (TypeError, ValueError):
        return []


def _accepts(fn: Any, base: Any) -> bool:
    """Whether `fn` takes every call the base method's signature allows (its positional parameters by position, its
    keyword-only ones by name): `(self, *args, **kwargs)` takes `(self, forward_context, **kwargs)`."""
    try:
        mine, theirs = inspect.signature(fn), inspect.signature(base)
    except (TypeError, ValueError):
        return True  # nothing to compare (a builtin)
    args: list[None] = []
    kwargs: dict[str, None] = {}
    for p in theirs.parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            args.append(None)
        elif p.kind == p.KEYWORD_ONLY:
            kwargs[p.name] = None
    try:
        mine.bind(*args, **kwargs)
    except TypeError:
        return False
    return True


def _hs_connectors() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for module, cls in (
        ("hs_connectors.fp8_hidden_states_connector", "FP8HiddenStatesConnector"),
        ("hs_connectors.mooncake_hidden_states_connector", "MooncakeHiddenStatesConnector"),
    ):
        try:
            klass = getattr(importlib.import_module(module), cls)
        except Exception as exc:
            out[cls] = {"import": f"{type(exc).__name__}: {exc}"[:500], "mismatches": []}
            continue
        mismatches = []
        for name, fn in vars(klass).items():
            if not callable(fn) or name.startswith("__"):
                continue
            for base in klass.__mro__[1:]:
                if base.__module__.startswith("vllm.") and name in vars(base):
                    mine, theirs = _params(fn), _params(vars(base)[name])
                    if not _accepts(fn, vars(base)[name]):
                        mismatches.append(
                            {
                                "method": name,
                                "base": f"{base.__module__}.{base.__name__}",
                                "theirs": theirs,
                                "mine": mine,
                            }
                        )
                    break
        abstract = sorted(getattr(klass, "__abstractmethods__", ()))
        out[cls] = {"import": "ok", "mismatches": mismatches, "unimplemented": abstract}
    return out


def main() -> int:
    facts = {
        "vllm": importlib.import_module("vllm").__version__,
        "speculators_types": _speculators_types(),
        "spec_config_fields": _fields(),
        "metrics": _metrics(sys.argv[1:]),
        "connectors": _connectors(),
        "hs_connectors": _hs_connectors(),
    }
    print(json.dumps(facts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
