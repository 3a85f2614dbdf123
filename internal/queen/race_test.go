//go:build race

package queen

// raceDetector says the tests run under the race detector, which makes
// the queen's CPU-bound work (decoding JSON) many times slower.
const raceDetector = true
