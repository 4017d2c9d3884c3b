//go:build race

package tests

// raceEnabled builds the sidecar under test with the race detector when the
// tests themselves run with it, so races in the real server fail the suite.
const raceEnabled = true
