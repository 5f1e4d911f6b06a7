# Sourced by hack/* scripts: `pod ARGS...` runs podman with this project's image store under
# ~/.cache/speculator-operator/containers (so an empty HOME is really cold), runc (crun cannot run on
# the cgroup v1 hybrid hierarchy these machines have), cgroupfs and file events (no systemd here).
# docs/development/real-node.md §1.
PODMAN_STORE=${SPECULATOR_PODMAN_STORE:-$HOME/.cache/speculator-operator/containers}
mkdir -p "$PODMAN_STORE/storage" "$PODMAN_STORE/run" "$PODMAN_STORE/tmp"
pod() {
  TMPDIR=$PODMAN_STORE/tmp podman --root "$PODMAN_STORE/storage" --runroot "$PODMAN_STORE/run" \
    --runtime /usr/sbin/runc --cgroup-manager cgroupfs --events-backend file "$@"
}
