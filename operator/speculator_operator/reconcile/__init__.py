"""Pure planners: observed world -> desired children + status, one module per kind."""
