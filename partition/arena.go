package partition

import "fmt"

// Limits of the tuple arena.
const (
	// ChunkBytesMin is the size of a table's first chunks. Chunk sizes
	// double with the arena up to ChunkBytesMax, so a small table costs a
	// few KiB, not a full chunk.
	ChunkBytesMin = 4 << 10
	// ChunkBytesMax is the size of the chunks of a large table: large
	// enough that 5 million rows make a few hundred heap objects, small
	// enough that evacuating one during compaction is a short copy.
	ChunkBytesMax = 1 << 20
	// TupleBytesMax bounds one stored tuple. A tuple larger than
	// ChunkBytesMax/4 gets a chunk of its own. It stays well below one wire
	// frame (wire.FramePayloadRawBytesMax), so every row the partition
	// accepts can be shipped by a rejoin in a block of its own; cow checks
	// this at compile time.
	TupleBytesMax = 4 << 20
	// compactGarbageBytesMin is the dead space below which a table does not
	// bother to compact, whatever the ratio.
	compactGarbageBytesMin = 256 << 10
	// compactStepSlotsMax and compactStepBytesMax bound the compaction work
	// done by one write: slots examined and tuple bytes moved (at least one
	// tuple is moved if one is found).
	compactStepSlotsMax = 64
	compactStepBytesMax = 16 << 10
)

// noChunk marks the absence of an open chunk.
const noChunk = ^uint32(0)

// arenaConfig holds the arena's sizes; tests shrink them to exercise chunk
// turnover and compaction with few rows.
type arenaConfig struct {
	chunkMin, chunkMax int // chunk sizes, powers of two, chunkMin <= chunkMax
	oversize           int // tuples above this get a chunk of their own
	garbageMin         int // compactGarbageBytesMin
	stepSlots          int // compactStepSlotsMax
	stepBytes          int // compactStepBytesMax
}

var defaultArenaConfig = arenaConfig{
	chunkMin:   ChunkBytesMin,
	chunkMax:   ChunkBytesMax,
	oversize:   ChunkBytesMax / 4,
	garbageMin: compactGarbageBytesMin,
	stepSlots:  compactStepSlotsMax,
	stepBytes:  compactStepBytesMax,
}

// chunk is one pointer-free block of tuple bytes. Tuples are placed by
// bumping an offset in the open chunk; nothing is freed inside a chunk, a
// dead tuple just stops counting in live. A chunk is released whole when
// live drops to zero, or emptied by compaction first.
type chunk struct {
	// buf holds the tuples; len(buf) is the chunk's size. nil once released.
	buf []byte
	// live is the byte count of the live tuples stored in buf. Invariant:
	// live == the sum of slotEntry.n over the live slots that point here.
	live int
	// evac marks a chunk that the running compaction is emptying. Invariant:
	// nothing is ever placed in an evac chunk, and no live slot below the
	// compaction cursor points into one.
	evac bool
}

// arena stores the tuples of one table in chunks.
type arena struct {
	cfg    arenaConfig
	chunks []chunk
	// released lists the indexes of released chunks, reused LIFO so that
	// chunks does not grow under churn.
	released []uint32
	// open is the chunk small tuples are placed in, or noChunk. Invariant:
	// the open chunk is never evac, and is never released while open (it
	// may have live == 0).
	open uint32
	// openUsed is the prefix of chunks[open].buf handed out so far.
	openUsed int
	// capBytes and liveBytes are the sums of len(buf) and live over the
	// unreleased chunks.
	capBytes, liveBytes int
	// evacChunks counts the chunks with evac set.
	evacChunks int
}

func newArena(cfg arenaConfig) arena {
	return arena{cfg: cfg, open: noChunk}
}

// bytes returns the n bytes at off in chunk c, with capacity clipped so an
// append by the caller cannot run into the next tuple.
func (a *arena) bytes(c, off, n uint32) []byte {
	return a.chunks[c].buf[off : off+n : off+n]
}

// alloc reserves n bytes (0 < n <= TupleBytesMax) and returns where they
// are and the slice to write them into. The bytes count as live.
func (a *arena) alloc(n int) (c, off uint32, dst []byte) {
	if n > a.cfg.oversize {
		c = a.newChunk(n)
		a.chunks[c].live = n
		a.liveBytes += n
		return c, 0, a.chunks[c].buf
	}
	if a.open == noChunk || a.openUsed+n > len(a.chunks[a.open].buf) {
		a.seal()
		size := a.cfg.chunkMin
		for size < a.cfg.chunkMax && (size < a.capBytes || size < n) {
			size *= 2
		}
		a.open = a.newChunk(size)
		a.openUsed = 0
	}
	c, off = a.open, uint32(a.openUsed)
	a.openUsed += n
	a.chunks[c].live += n
	a.liveBytes += n
	return c, off, a.chunks[c].buf[off : off+uint32(n) : off+uint32(n)]
}

// newChunk makes a chunk of size bytes and returns its index.
func (a *arena) newChunk(size int) uint32 {
	var c uint32
	if k := len(a.released); k > 0 {
		c = a.released[k-1]
		a.released = a.released[:k-1]
	} else {
		c = uint32(len(a.chunks))
		a.chunks = append(a.chunks, chunk{})
	}
	a.chunks[c] = chunk{buf: make([]byte, size)}
	a.capBytes += size
	return c
}

// seal closes the open chunk, whose unused tail becomes dead space.
func (a *arena) seal() {
	c := a.open
	if c == noChunk {
		return
	}
	a.open = noChunk
	if a.chunks[c].live == 0 {
		a.release(c)
	}
}

// free drops n live bytes from chunk c: a tuple died or moved out.
func (a *arena) free(c uint32, n int) {
	ch := &a.chunks[c]
	ch.live -= n
	a.liveBytes -= n
	if ch.live < 0 {
		panic(fmt.Sprintf("partition: chunk %d live bytes went negative (%d)", c, ch.live))
	}
	if ch.live == 0 && c != a.open {
		a.release(c)
	}
}

// release gives chunk c's memory back to the heap.
func (a *arena) release(c uint32) {
	ch := &a.chunks[c]
	if ch.live != 0 || c == a.open {
		panic(fmt.Sprintf("partition: release of chunk %d with %d live bytes (open %d)", c, ch.live, a.open))
	}
	a.capBytes -= len(ch.buf)
	if ch.evac {
		a.evacChunks--
	}
	*ch = chunk{}
	a.released = append(a.released, c)
}

// sealedDead returns the dead bytes of the sealed chunks (all but the
// open one) and their total size.
func (a *arena) sealedDead() (dead, size int) {
	size, live := a.capBytes, a.liveBytes
	if a.open != noChunk {
		size -= len(a.chunks[a.open].buf)
		live -= a.chunks[a.open].live
	}
	return size - live, size
}

// shouldCompact reports whether dead space in sealed chunks is over a
// quarter of their size and over cfg.garbageMin. Then at least one sealed
// chunk is less than three quarters live, so markEvacuation marks one.
func (a *arena) shouldCompact() bool {
	dead, size := a.sealedDead()
	return dead >= a.cfg.garbageMin && dead*4 > size
}

// markEvacuation marks for evacuation every sealed chunk that is less than
// three quarters live, and returns how many it marked. Moving a chunk's
// live bytes costs at most three times the space it frees.
func (a *arena) markEvacuation() int {
	marked := 0
	for c := range a.chunks {
		ch := &a.chunks[c]
		if ch.buf == nil || uint32(c) == a.open || ch.evac || ch.live*4 >= len(ch.buf)*3 {
			continue
		}
		ch.evac = true
		marked++
	}
	a.evacChunks += marked
	return marked
}
