"""The operator process around the controllers: its entry (`speculator-operator run`: entry), the kube client and
server-side apply (kube), leader election (leader; its pure rules: election), the permission check at start
(permissions), the operator's own metrics, the scheduler of level-triggered reconciles and periodic work
(scheduler; its pure rules: schedule), and the process's memory (allocator, profiling)."""
