//go:build race

package redisstate_test

// raceDetector: the race detector slows every call several times over.
const raceDetector = true
