package frame

import (
	"bytes"
	"errors"
	"io"
	"sync"

	"github.com/klauspost/compress/zstd"
)

// window is the zstd window Encode uses and the largest Decode accepts: a
// body up to this size is one segment whose window is the body itself, a
// larger one is compressed within it. A frame asking for more is refused
// before anything is allocated for it.
const window = 1 << 20

// encoder is shared (EncodeAll may run concurrently).
var encoder = mustEncoder()

func mustEncoder() *zstd.Encoder {
	e, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedDefault),
		zstd.WithEncoderConcurrency(1), zstd.WithWindowSize(window))
	if err != nil {
		panic(err) // fixed, valid options
	}
	return e
}

// decoders are streaming decoders, synchronous (concurrency 1) and bounded
// to window, reused across frames.
var decoders = sync.Pool{New: func() any {
	d, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1),
		zstd.WithDecoderMaxWindow(window), zstd.WithDecoderLowmem(true))
	if err != nil {
		panic(err) // fixed, valid options
	}
	return d
}}

// decompress reads the declared body length and the zstd data after it.
// Invariant: nothing is expanded past the declared length, which is at most
// limit: a larger declaration is refused before decoding, and the decoder
// is read through a buffer of exactly that length plus one probe byte, so
// a bomb stops there (its decoder holds at most one window besides).
func decompress(b []byte, limit int) ([]byte, error) {
	r := reader{b: b}
	n, err := r.uvarint("decoded length")
	if err != nil {
		return nil, malformedf("%v", err)
	}
	if n > uint64(limit) {
		return nil, malformedf("declares %d decoded bytes, more than the limit of %d (refused unexpanded)", n, limit)
	}
	if n == 0 {
		return nil, malformedf("declares an empty body")
	}
	d := decoders.Get().(*zstd.Decoder)
	defer func() {
		d.Reset(nil) // drop the reference to b
		decoders.Put(d)
	}()
	if err := d.Reset(bytes.NewReader(r.b)); err != nil {
		return nil, malformedf("zstd data: %v", err)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(d, body); err != nil {
		return nil, malformedf("zstd data ends before the declared %d bytes: %v", n, err)
	}
	var probe [1]byte
	switch k, err := d.Read(probe[:]); {
	case k > 0:
		return nil, malformedf("zstd data expands past the declared %d bytes (refused unexpanded)", n)
	case !errors.Is(err, io.EOF):
		return nil, malformedf("zstd data after the declared %d bytes: %v", n, err)
	}
	return body, nil
}
