//go:build race

package sim

// raceEnabled is set under the race detector, which makes every memory
// access several times slower: the seeded tests then run fewer seeds.
const raceEnabled = true
