"""Taking over what an earlier operator wrote, with no rollout of its own (docs/operations/upgrades.md).

Operators up to fe501e0 hashed a serving revision without the server image; since then the image is in the hash
(a new build of the same tag is a new revision). Rendered anew, a pair such an operator rolled out gets a new
revision name, and its pods would roll for a name alone. So the name it gave is kept while it names exactly the
pair rendered now: the stored revision is the old hash of the same inputs, and the child runs the same images.
Anything that changes (a spec edit, new draft bytes, an image pinned by digest) renders a new revision as ever.
"""

from __future__ import annotations

from typing import Any

from speculator_operator.render.serving import Inputs, Rendered, legacy_revision_hash


def _images(deployment: dict[str, Any] | None) -> list[tuple[str, str]]:
    pod = (((deployment or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
    containers = [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]
    return sorted((str(c.get("name")), str(c.get("image"))) for c in containers)


def kept_revision(inputs: Inputs, rendered: Rendered, stored: str | None, child: dict[str, Any] | None) -> str | None:
    """The revision an earlier operator gave this same pair, when it is to be kept; None: the new name."""
    if not stored or stored == rendered.revision or child is None:
        return None
    if stored != legacy_revision_hash(inputs, rendered.vllm_args):
        return None
    ours = next((c for c in rendered.children if c.get("kind") == "Deployment"), None)
    return stored if ours is not None and _images(ours) == _images(child) else None
