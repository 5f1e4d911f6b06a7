// CoreDNS with only the plugins the local cluster's DNS needs (hack/build-kube builds it): names of
// Services and pods from the API server, and no forwarder, so no query leaves this machine.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
)

// The plugins in the order CoreDNS's own plugin.cfg runs them.
var directives = []string{"bind", "ready", "health", "errors", "cache", "kubernetes"}

func init() {
	dnsserver.Directives = directives
}

func main() {
	coremain.Run()
}
