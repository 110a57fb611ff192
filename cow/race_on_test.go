//go:build race

package cow

// raceEnabled is set under the race detector, which makes every memory
// access several times slower: the property test then runs fewer seeds.
const raceEnabled = true
