// The CNCF distribution registry with only what the local cluster needs (hack/build-kube builds it): the
// filesystem storage driver, no auth, no proxy, no cloud storage drivers, so the build pulls in no cloud
// SDKs and the registry can reach nothing but its own folder.
package main

import (
	"os"

	"github.com/distribution/distribution/v3/registry"

	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem"
)

func main() {
	if err := registry.RootCmd.Execute(); err != nil {
		os.Exit(1)
	}
}
