package intake

import (
	"encoding/binary"
	"hash/crc32"
)

// A frame: u32 length of the payload, u32 CRC-32C of the payload, both
// little endian, then the payload (see the package comment).

// MaxRecord is the largest payload a frame may claim; one claiming more
// is damage.
const MaxRecord = 1 << 30

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Checksum is a frame's checksum of payload: CRC-32C.
func Checksum(payload []byte) uint32 { return crc32.Checksum(payload, castagnoli) }

// AppendFrame appends to b a frame whose payload encode appends, and
// returns b and the payload (a slice of b).
func AppendFrame(b []byte, encode func([]byte) []byte) (_, payload []byte) {
	at := len(b)
	b = append(b, 0, 0, 0, 0, 0, 0, 0, 0)
	b = encode(b)
	payload = b[at+8:]
	binary.LittleEndian.PutUint32(b[at:], uint32(len(payload)))
	binary.LittleEndian.PutUint32(b[at+4:], Checksum(payload))
	return b, payload
}

// FrameAt reports whether a whole frame, its checksum holding, starts at
// off in data, and the length of its payload.
func FrameAt(data []byte, off int64) (int64, bool) {
	if int64(len(data))-off < 8 {
		return 0, false
	}
	n := int64(binary.LittleEndian.Uint32(data[off:]))
	if n == 0 || n > MaxRecord || off+8+n > int64(len(data)) {
		return 0, false
	}
	sum := binary.LittleEndian.Uint32(data[off+4:])
	return n, Checksum(data[off+8:off+8+n]) == sum
}
