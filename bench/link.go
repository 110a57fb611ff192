package bench

// link is one direction of the in-process connection between the source
// and the destination drivers: whole wire frames, in order, over a bounded
// channel. It stands for a TCP connection without the kernel: the frames
// are encoded, checksummed and (with a codec) compressed exactly as they
// would be on a socket, so the figures include the wire's CPU cost but no
// syscalls and no network.
//
// free recycles frame buffers from the receiver back to the sender, so a
// snapshot of gigabytes does not allocate a fresh buffer per block. It is
// bounded like frames: a buffer that finds it full is left to the
// collector.
type link struct {
	frames chan []byte
	free   chan []byte
}

func newLink(framesMax int) *link {
	return &link{frames: make(chan []byte, framesMax), free: make(chan []byte, framesMax)}
}

// buffer returns a recycled buffer to encode a frame into, or nil.
func (l *link) buffer() []byte {
	select {
	case b := <-l.free:
		return b[:0]
	default:
		return nil
	}
}

// recycle hands a frame's buffer back to the sender once nothing refers to
// it any more (the message decoded from it has been handled).
func (l *link) recycle(b []byte) {
	select {
	case l.free <- b:
	default:
	}
}
