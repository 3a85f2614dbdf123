//go:build race

package hive

// testPortBase is the first worker port of this package's test hives:
// make test runs the race run beside the plain one, and the two must not
// hand out the same ports (a test checks that a stopped worker's port is
// free again).
const testPortBase = 30000
