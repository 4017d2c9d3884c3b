// Command extauthz is a rate-limiting external-authorization sidecar for
// Envoy: it answers envoy.service.auth.v3.Authorization/Check.
package main

import "os"

func main() {
	argv0 = os.Args[0]
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
