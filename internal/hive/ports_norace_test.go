//go:build !race

package hive

// testPortBase is the first worker port of this package's test hives
// (ports_race_test.go has the race run's).
const testPortBase = 20000
