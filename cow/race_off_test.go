//go:build !race

package cow

const raceEnabled = false
