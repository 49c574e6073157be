package testimages

import (
	"archive/tar"
	"fmt"
	"strconv"
)

// SparseTar is a layer whose one entry, name, is a GNU sparse 1.0 file of
// realSize bytes that is all hole: 3 KiB of tar that archive/tar reads as
// realSize zeros. Hostile layers use it to claim far more bytes than they
// carry; it is shared by the unpacker's unit tests and the hostile-image
// tests so that both feed berth the same bytes.
func SparseTar(name string, realSize int64) []byte {
	recs := paxRecord("GNU.sparse.major", "1") + paxRecord("GNU.sparse.minor", "0") +
		paxRecord("GNU.sparse.name", name) + paxRecord("GNU.sparse.realsize", strconv.FormatInt(realSize, 10))
	var out []byte
	out = append(out, rawUstar("PaxHeaders/"+name, tar.TypeXHeader, int64(len(recs)))...)
	out = append(out, padBlock([]byte(recs))...)
	out = append(out, rawUstar("GNUSparseFile.0/"+name, tar.TypeReg, 512)...)
	out = append(out, padBlock([]byte("0\n"))...)
	return append(out, make([]byte, 1024)...)
}

// rawUstar is one ustar header block, written by hand: archive/tar's
// writer will not write GNU sparse records, and hostile layers do.
func rawUstar(name string, typ byte, size int64) []byte {
	b := make([]byte, 512)
	copy(b[0:100], name)
	copy(b[100:108], "0000644\x00")
	copy(b[108:116], "0000000\x00")
	copy(b[116:124], "0000000\x00")
	copy(b[124:136], fmt.Sprintf("%011o\x00", size))
	copy(b[136:148], fmt.Sprintf("%011o\x00", 1600000000))
	copy(b[148:156], "        ")
	b[156] = typ
	copy(b[257:263], "ustar\x00")
	copy(b[263:265], "00")
	sum := 0
	for _, c := range b {
		sum += int(c)
	}
	copy(b[148:156], fmt.Sprintf("%06o\x00 ", sum))
	return b
}

// paxRecord is one PAX extended-header record, "len key=value\n", where
// len counts its own digits.
func paxRecord(k, v string) string {
	rec := " " + k + "=" + v + "\n"
	n := len(rec) + 1
	for len(strconv.Itoa(n))+len(rec) != n {
		n = len(strconv.Itoa(n)) + len(rec)
	}
	return strconv.Itoa(n) + rec
}

// padBlock pads b with zeros to a whole number of 512-byte tar blocks.
func padBlock(b []byte) []byte {
	if r := len(b) % 512; r != 0 {
		b = append(b, make([]byte, 512-r)...)
	}
	return b
}
