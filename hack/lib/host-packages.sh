# Sourced by hack/* scripts: `need_packages CMD=PACKAGE ...` installs (apt-get, as root) the Debian
# packages whose commands are missing, so a fresh machine needs nothing done by hand. Without root or
# apt it fails naming what is missing (return 1); callers decide whether that is fatal.
need_packages() {
  local missing=() pair cmd pkg
  for pair in "$@"; do
    cmd=${pair%%=*}; pkg=${pair#*=}
    if ! command -v "$cmd" >/dev/null 2>&1 && [ ! -x "$cmd" ]; then missing+=("$pkg"); fi
  done
  [ ${#missing[@]} = 0 ] && return 0
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "host-packages: missing ${missing[*]} and cannot install them here (needs root and apt-get)" >&2
    return 1
  fi
  echo "host-packages: installing ${missing[*]} (apt-get)" >&2
  local log=${HOME}/.cache/speculator-operator/logs/apt.log
  mkdir -p "$(dirname "$log")"
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >"$log" 2>&1; then
    # the package lists may be missing or stale on a fresh machine
    DEBIAN_FRONTEND=noninteractive apt-get update -q >>"$log" 2>&1 || true
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >>"$log" 2>&1; then
      echo "host-packages: apt-get install ${missing[*]} FAILED; last lines of $log:" >&2
      tail -n 20 "$log" >&2
      return 1
    fi
  fi
}

# The Debian packages of the real node (docs/development/real-node.md): containerd, runc, the CNI
# plugins, nftables, iproute2; and of the image builds: podman, buildah, mmdebstrap.
need_node_packages() {
  need_packages /usr/bin/containerd=containerd /usr/sbin/runc=runc /usr/lib/cni/bridge=containernetworking-plugins \
    /usr/sbin/nft=nftables /usr/sbin/ip=iproute2
}
need_image_packages() {
  need_packages podman=podman buildah=buildah /usr/sbin/runc=runc mmdebstrap=mmdebstrap
}
# promtool, which checks the chart's alert rules and dashboard queries (Debian's prometheus package).
need_monitoring_packages() {
  need_packages /usr/bin/promtool=prometheus
}
