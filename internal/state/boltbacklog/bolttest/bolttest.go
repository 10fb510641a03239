// Package bolttest damages copies of a bbolt file the ways a failing disk,
// a full one or a careless copy do (truncated, pages overwritten, page
// headers broken, stray bytes), for tests of code that must refuse such a
// file with an error rather than crash on it.
package bolttest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
)

// Damage is one damaged copy of a file.
type Damage struct {
	// Name says what was done, e.g. "truncated to 8192 bytes".
	Name string
	// Data is the damaged copy.
	Data []byte
}

// Layout is what Damages reads of a sound bbolt file.
type Layout struct {
	PageSize int
	// Pages is the high-water mark: pages 0 to Pages-1 are in use or free.
	Pages int
	// Freelist is the freelist's page.
	Freelist int
	// Nodes are the branch and leaf pages in use, Branches those of them
	// that are branch pages.
	Nodes, Branches []int
}

var native = binary.NativeEndian

// ReadLayout reads the layout of the sound bbolt file data: its newer
// meta page, freelist and node pages.
func ReadLayout(data []byte) (Layout, error) {
	if len(data) < 4096 {
		return Layout{}, fmt.Errorf("bolttest: %d bytes, too short for a bbolt file", len(data))
	}
	ps := int(native.Uint32(data[16+8:]))
	if ps < 1024 || 2*ps > len(data) {
		return Layout{}, fmt.Errorf("bolttest: page size %d in a file of %d bytes", ps, len(data))
	}
	m := data[16:]
	if m1 := data[ps+16:]; native.Uint64(m1[48:]) > native.Uint64(m[48:]) {
		m = m1
	}
	l := Layout{PageSize: ps, Pages: int(native.Uint64(m[40:])), Freelist: int(native.Uint64(m[32:]))}
	if l.Pages*ps > len(data) || l.Freelist >= l.Pages {
		return Layout{}, errors.New("bolttest: not a sound bbolt file (pages past its end, or no freelist page)")
	}
	free := map[int]bool{}
	fl := data[l.Freelist*ps:]
	n, first := int(native.Uint16(fl[10:])), 16
	if n == 0xFFFF {
		n, first = int(native.Uint64(fl[16:])), 24
	}
	for i := range n {
		free[int(native.Uint64(fl[first+8*i:]))] = true
	}
	for id := 2; id < l.Pages; {
		p := data[id*ps:]
		flags, overflow := native.Uint16(p[8:]), int(native.Uint32(p[12:]))
		switch {
		case free[id] || id == l.Freelist:
			overflow = 0 // a free page's header is stale; the freelist's own span is marked free beside it
			if id == l.Freelist {
				overflow = int(native.Uint32(p[12:]))
			}
		case flags == 0x01:
			l.Branches = append(l.Branches, id)
			l.Nodes = append(l.Nodes, id)
		case flags == 0x02:
			l.Nodes = append(l.Nodes, id)
		}
		id += 1 + overflow
	}
	if len(l.Nodes) == 0 {
		return Layout{}, errors.New("bolttest: no branch or leaf page in use")
	}
	return l, nil
}

// Damages returns damaged copies of the sound bbolt file data, the same
// ones for the same seed: truncations at lengths below the pages in use,
// node pages overwritten (zeroed, with 0xff, with another page's bytes),
// page headers broken (type flags, element count, overflow, own id), both
// meta pages zeroed, the freelist's count broken, and random bytes at
// random offsets within the headers and element arrays of node pages.
// Each copy breaks what bbolt trusts; none is a file bbolt can read safely.
func Damages(data []byte, seed uint64) ([]Damage, error) {
	l, err := ReadLayout(data)
	if err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	ps, end := l.PageSize, l.Pages*l.PageSize
	var out []Damage
	add := func(name string, b []byte) { out = append(out, Damage{Name: name, Data: b}) }
	edit := func(name string, fn func(b []byte)) {
		b := append([]byte(nil), data...)
		fn(b)
		add(name, b)
	}
	for _, n := range []int{1, 100, ps, 2*ps + 17, end / 2, end - ps, end - 1} {
		add(fmt.Sprintf("truncated to %d of %d bytes", n, len(data)), append([]byte(nil), data[:n]...))
	}
	leaf := l.Nodes[rng.IntN(len(l.Nodes))]
	node := func() int { return l.Nodes[rng.IntN(len(l.Nodes))] }
	edit(fmt.Sprintf("page %d zeroed", leaf), func(b []byte) { clear(b[leaf*ps : (leaf+1)*ps]) })
	if len(l.Branches) > 0 {
		br := l.Branches[rng.IntN(len(l.Branches))]
		edit(fmt.Sprintf("branch page %d filled with 0xff", br), func(b []byte) {
			for i := br * ps; i < (br+1)*ps; i++ {
				b[i] = 0xff
			}
		})
	}
	if len(l.Nodes) > 1 {
		to, from := node(), node()
		for from == to {
			from = node()
		}
		edit(fmt.Sprintf("page %d overwritten with page %d", to, from), func(b []byte) {
			copy(b[to*ps:(to+1)*ps], data[from*ps:(from+1)*ps])
		})
	}
	p := node()
	edit(fmt.Sprintf("page %d's type flags set to 0x7f", p), func(b []byte) { native.PutUint16(b[p*ps+8:], 0x7f) })
	p = node()
	edit(fmt.Sprintf("page %d's element count set to 0xfffe", p), func(b []byte) { native.PutUint16(b[p*ps+10:], 0xfffe) })
	p = node()
	edit(fmt.Sprintf("page %d's overflow set to 1<<30", p), func(b []byte) { native.PutUint32(b[p*ps+12:], 1<<30) })
	p = node()
	edit(fmt.Sprintf("page %d names itself page %d", p, p+1), func(b []byte) { native.PutUint64(b[p*ps:], uint64(p+1)) })
	edit("both meta pages zeroed", func(b []byte) { clear(b[:2*ps]) })
	edit(fmt.Sprintf("freelist page %d's count set to 0xffff with a first id of 1<<40", l.Freelist), func(b []byte) {
		native.PutUint16(b[l.Freelist*ps+10:], 0xffff)
		native.PutUint64(b[l.Freelist*ps+16:], 1<<40)
	})
	for range 8 {
		p := node()
		// All 8 bytes within the header and the element array: random
		// bytes there make ids, offsets and sizes that point astray.
		count := int(native.Uint16(data[p*ps+10:]))
		off := p*ps + rng.IntN(16+16*count-8+1)
		var junk [8]byte
		for {
			native.PutUint64(junk[:], rng.Uint64())
			if [8]byte(data[off:off+8]) != junk {
				break
			}
		}
		edit(fmt.Sprintf("8 random bytes at offset %d (page %d's header or elements)", off, p), func(b []byte) { copy(b[off:], junk[:]) })
	}
	return out, nil
}
