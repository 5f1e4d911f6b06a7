"""The operator's watches of its children's kinds ask the API server for its own objects only."""

from __future__ import annotations

import kopf

from speculator_operator.api.common import GROUP
from speculator_operator.api.labels import MANAGED_BY_LABEL
from speculator_operator.controllers import CHILD_KINDS, watch_only_children
from speculator_operator.render.serving import MANAGED_BY

MANAGED = MANAGED_BY_LABEL


def _handlers() -> list[object]:
    # kopf has no public way to list a registry's handlers: its registries' own containers are read here (a
    # test only; the operator itself uses kopf's public API)
    registry = kopf.get_default_registry()
    return [*registry._watching.get_all_handlers(), *registry._indexing.get_all_handlers()]


def test_every_handler_on_another_kind_is_a_child_kind_filtered_by_the_operators_label() -> None:
    others = [h for h in _handlers() if h.selector.group != GROUP]  # type: ignore[attr-defined]
    assert others  # the children's handlers are registered
    for handler in others:
        selector = handler.selector  # type: ignore[attr-defined]
        assert (selector.group, selector.any_name) in CHILD_KINDS, selector
        assert (handler.labels or {}).get(MANAGED) == MANAGED_BY, selector  # type: ignore[attr-defined]


def test_the_child_kinds_are_selected_by_label_on_the_api_server_and_the_projects_kinds_are_not() -> None:
    settings = kopf.OperatorSettings()
    watch_only_children(settings)
    for group, plural in CHILD_KINDS:
        resource = kopf.Resource(group=group, version="v1", plural=plural)
        assert list(settings.watching.label_selectors.collect(resource)) == [f"{MANAGED}={MANAGED_BY}"]
    own = kopf.Resource(group=GROUP, version="v1alpha1", plural="speculatordeployments", kind="SpeculatorDeployment")
    assert list(settings.watching.label_selectors.collect(own)) == []
    other = kopf.Resource(group="apps", version="v1", plural="statefulsets")
    assert list(settings.watching.label_selectors.collect(other)) == []
