"""Pure facts and rules of the domain, shared by the operator, the CLI and the pods: the algorithm table
(algorithms), the pinned releases (releases), the economics of speculation (economics) and checkpoints:
header-only sources, the format and the audit rules (checkpoint/)."""
