package load

import (
	"encoding/binary"
	"math/rand/v2"
)

// KeyBytesMin is the shortest key: room for the row number that makes it
// unique.
const KeyBytesMin = 8

// Key returns the key of row i, keyBytes long (at least 8), the shape of
// every workload's keys (bench's in-process rejoin calls AppendKey too):
// the row number big-endian in the last 8 bytes
// (unique), a hash of it before that (so keys do not share prefixes). A
// pure function of i, so a writer picks an existing row without a list.
func Key(i uint64, keyBytes int) []byte {
	return AppendKey(make([]byte, 0, max(keyBytes, KeyBytesMin)), i, keyBytes)
}

// AppendKey appends Key(i, keyBytes) to dst.
func AppendKey(dst []byte, i uint64, keyBytes int) []byte {
	h := i
	for n := 0; n < keyBytes-KeyBytesMin; n += 8 {
		h = mix64(h + 0x9e3779b97f4a7c15)
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], h)
		dst = append(dst, b[:min(8, keyBytes-KeyBytesMin-n)]...)
	}
	return binary.BigEndian.AppendUint64(dst, i)
}

// KeyIndex returns the row number of a key made by Key.
func KeyIndex(key []byte) (uint64, bool) {
	if len(key) < KeyBytesMin {
		return 0, false
	}
	return binary.BigEndian.Uint64(key[len(key)-KeyBytesMin:]), true
}

// patterns are bench's 16 fixed 16-byte patterns (the same seed).
var patterns = func() (p [16][16]byte) {
	rng := rand.New(rand.NewPCG(1, 1))
	for i := range p {
		for j := range p[i] {
			p[i][j] = byte('a' + rng.IntN(26))
		}
	}
	return p
}()

// Value returns the value that write number version puts in row i,
// valueBytes long, in bench's shape: the first 64% (rounded down to 16
// bytes) repeat one of 16 fixed patterns, the rest is pseudo-random. A
// pure function of (i, version), so a reader can tell which write a
// value came from.
func Value(i, version uint64, valueBytes int) []byte {
	return AppendValue(make([]byte, 0, valueBytes), i, version, valueBytes)
}

// AppendValue appends Value(i, version, valueBytes) to dst.
func AppendValue(dst []byte, i, version uint64, valueBytes int) []byte {
	seed := mix64(i*0x9e3779b97f4a7c15 ^ mix64(version+1))
	p := &patterns[seed%uint64(len(patterns))]
	patterned := valueBytes * 64 / 100 &^ 15
	for n := 0; n < patterned; n += len(p) {
		dst = append(dst, p[:]...)
	}
	h := seed
	for n := patterned; n < valueBytes; n += 8 {
		h = mix64(h + 0x9e3779b97f4a7c15)
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], h)
		dst = append(dst, b[:min(8, valueBytes-n)]...)
	}
	return dst
}

// mix64 is SplitMix64's finaliser: a cheap bijective scramble.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}
