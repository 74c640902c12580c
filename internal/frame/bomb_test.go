package frame

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"runtime"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// zstdBomb is a real zstd frame that expands to blocks × 128 KiB zero
// bytes from 4 bytes per block: RLE blocks (RFC 8878 3.1.1.2), without
// a content size in its header, or with the true one when fcs.
func zstdBomb(blocks int, fcs bool) []byte {
	const blockSize = 128 << 10
	b := []byte{0x28, 0xb5, 0x2f, 0xfd}
	if fcs {
		b = append(b, 0xc0, 0x38) // 8-byte content size; window 2^17
		b = binary.LittleEndian.AppendUint64(b, uint64(blocks)*blockSize)
	} else {
		b = append(b, 0x00, 0x38) // no content size; window 2^17
	}
	for i := 0; i < blocks; i++ {
		h := uint32(blockSize)<<3 | 1<<1 // RLE block
		if i == blocks-1 {
			h |= 1 // last block
		}
		b = append(b, byte(h), byte(h>>8), byte(h>>16), 0)
	}
	return b
}

func zstdFrame(declared uint64, data []byte) []byte {
	b := append([]byte(Magic), Version, compZstd)
	b = binary.AppendUvarint(b, declared)
	return append(b, data...)
}

// TestDecompressionBombIsRefusedUnexpanded: a 32 KiB zstd frame that
// expands to 1 GiB is refused whatever length the frame declares, and
// decoding it allocates a small fraction of the limit (it is never
// expanded).
func TestDecompressionBombIsRefusedUnexpanded(t *testing.T) {
	const gib = 1 << 30
	bomb := zstdBomb(gib/(128<<10), false)
	bombFCS := zstdBomb(gib/(128<<10), true)

	// It is a real bomb: an unbounded decoder expands it to 1 GiB.
	dec, err := zstd.NewReader(bytes.NewReader(bomb), zstd.WithDecoderConcurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, dec)
	dec.Close()
	if err != nil || n != gib {
		t.Fatalf("the bomb expands to %d bytes (%v), want %d", n, err, gib)
	}
	t.Logf("bomb: %d bytes of zstd expand to %d", len(bomb), n)

	lim := Limits{MaxEvents: 100, MaxDecodedBytes: 1 << 20}
	for name, b := range map[string][]byte{
		"declares its true size":             zstdFrame(gib, bomb),
		"declares 1000 bytes":                zstdFrame(1000, bomb),
		"declares the limit":                 zstdFrame(1<<20, bomb),
		"declares 1000, header says 1 GiB":   zstdFrame(1000, bombFCS),
		"declares the limit, header 1 GiB":   zstdFrame(1<<20, bombFCS),
		"declares the default limit exactly": zstdFrame(MaxDecodedBytes, bomb),
	} {
		l := lim
		if name == "declares the default limit exactly" {
			l = DefaultLimits
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, _, err := Decode(b, l)
		runtime.ReadMemStats(&after)
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err = %v, want ErrMalformed", name, err)
		}
		// The decoded bytes could at most reach the declared capacity (bounded
		// by the limit): allocations stay within it plus the decoder's buffers.
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > uint64(l.MaxDecodedBytes)+4<<20 {
			t.Errorf("%s: decoding allocated %d bytes, more than the %d-byte limit: the bomb was expanded", name, alloc, l.MaxDecodedBytes)
		}
		t.Logf("%s: %v", name, err)
	}
}

// TestZstdWindowOverTheBoundIsRefused: a zstd frame asking for a 2 MiB
// window (more than the 1 MiB Encode uses) is refused, though its data is
// one byte.
func TestZstdWindowOverTheBoundIsRefused(t *testing.T) {
	small := []byte{0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x50, 0x09, 0x00, 0x00, 'x'} // window 2^20: accepted
	if _, err := decompress(append(uv(1), small...), 100); err != nil {
		t.Fatalf("a 1 MiB window is refused: %v", err)
	}
	big := []byte{0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x58, 0x09, 0x00, 0x00, 'x'} // window 2^21
	if _, err := decompress(append(uv(1), big...), 100); !errors.Is(err, ErrMalformed) {
		t.Fatalf("a 2 MiB window: err = %v, want ErrMalformed", err)
	} else {
		t.Log(err)
	}
}
