package boltbacklog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"runtime/debug"

	bolt "go.etcd.io/bbolt"

	"github.com/sluice-sched/sluice/admission/deferral"
)

// DamagedError is Open's error for a file that is not a sound backlog:
// truncated, overwritten, or with records its indexes do not match.
// Nothing was changed in the file.
type DamagedError struct {
	Path string
	// Err says what is wrong, and where.
	Err error
}

func (e *DamagedError) Error() string {
	return fmt.Sprintf("boltbacklog: %s is damaged: %v", e.Path, e.Err)
}

func (e *DamagedError) Unwrap() error { return e.Err }

// bbolt's file format (version 2), in the machine's byte order: bbolt
// writes its structs as they lie in memory.
const (
	pageHeaderSize   = 16 // id uint64, flags uint16, count uint16, overflow uint32
	elementSize      = 16 // a branch or leaf element
	bucketHeaderSize = 16 // root page id uint64, sequence uint64
	metaSize         = 64 // magic, version, page size, flags, root bucket, freelist, high-water mark, txid, checksum
	metaChecksumAt   = 56

	branchPageFlag   = 0x01
	leafPageFlag     = 0x02
	freelistPageFlag = 0x10
	bucketLeafFlag   = 0x01

	boltMagic   uint32 = 0xED0CDAED
	boltVersion uint32 = 2
	noFreelist         = ^uint64(0)

	// minPageSize and maxPageSize bound the page sizes bbolt probes for
	// (1 KiB to 16 MiB).
	minPageSize = 1 << 10
	maxPageSize = 1 << 24
	// maxTreeDepth bounds the nesting of pages and buckets: a B+tree of
	// this file's few buckets is a handful of levels deep, so a deeper
	// one is pages that point back into their own tree.
	maxTreeDepth = 64
)

var native = binary.NativeEndian

// meta is what the verifier reads of a meta page.
type meta struct {
	pageSize uint64
	root     uint64
	freelist uint64
	hwm      uint64 // pages in use: every page id is below it
	txid     uint64
}

// parseMeta reads the meta of the page that starts p, checking it as
// bbolt does: magic, version and checksum.
func parseMeta(p []byte) (meta, error) {
	if len(p) < pageHeaderSize+metaSize {
		return meta{}, fmt.Errorf("%d bytes, too short for a meta page", len(p))
	}
	m := p[pageHeaderSize : pageHeaderSize+metaSize]
	switch {
	case native.Uint32(m[0:]) != boltMagic:
		return meta{}, errors.New("not a bbolt meta page (wrong magic number)")
	case native.Uint32(m[4:]) != boltVersion:
		return meta{}, fmt.Errorf("bbolt format version %d, want %d", native.Uint32(m[4:]), boltVersion)
	}
	h := fnv.New64a()
	h.Write(m[:metaChecksumAt])
	if h.Sum64() != native.Uint64(m[metaChecksumAt:]) {
		return meta{}, errors.New("checksum mismatch")
	}
	return meta{
		pageSize: uint64(native.Uint32(m[8:])),
		root:     native.Uint64(m[16:]),
		freelist: native.Uint64(m[32:]),
		hwm:      native.Uint64(m[40:]),
		txid:     native.Uint64(m[48:]),
	}, nil
}

// Page states in the verifier's map.
const (
	pageUnseen = iota
	pageInUse
	pageFree
)

// verifier walks a bbolt file with plain reads, trusting nothing it has
// not checked: bbolt maps the file and follows its page ids and offsets
// without bounds checks, so a damaged file makes it fault or panic, at
// open or on whichever later read first meets the damage. What passes
// here is safe for bbolt to read.
type verifier struct {
	r     io.ReaderAt
	size  int64
	ps    uint64
	m     meta
	pages []byte // per page id below the high-water mark: unseen, in use or free
}

// verifyFile checks the structure of the bbolt file f of size bytes (not
// empty): the meta page bbolt would use, the file's length against it,
// the freelist, and every page of every bucket's tree (page ids and
// types, element bounds, key order, each page used once and never also
// free), and that every page is in use or free.
func verifyFile(r io.ReaderAt, size int64) error {
	v := &verifier{r: r, size: size}
	if err := v.readMeta(); err != nil {
		return err
	}
	v.pages = make([]byte, v.m.hwm)
	v.pages[0], v.pages[1] = pageInUse, pageInUse
	if v.m.freelist != noFreelist {
		if err := v.readFreelist(); err != nil {
			return err
		}
	}
	if err := v.walkPage(v.m.root, "the meta page's root bucket", 0, nil, nil); err != nil {
		return err
	}
	if v.m.freelist == noFreelist {
		return nil // bbolt rebuilds the free pages from the tree
	}
	for id, st := range v.pages {
		if st == pageUnseen {
			return fmt.Errorf("page %d is neither in any bucket's tree nor free", id)
		}
	}
	return nil
}

// readMeta finds the page size as bbolt does (from the first meta page,
// else from the second found at each possible page size) and takes the
// meta bbolt would use: the valid one with the higher transaction id.
func (v *verifier) readMeta() error {
	first, err0 := v.metaAt(0)
	ps := first.pageSize
	if err0 != nil {
		for i := 0; i <= 14; i++ {
			pos := int64(minPageSize) << i
			if pos >= v.size-minPageSize {
				break
			}
			if m, err := v.metaAt(pos); err == nil {
				ps = m.pageSize
				break
			}
		}
		if ps == 0 {
			return fmt.Errorf("no valid meta page (the first: %v; no second found)", err0)
		}
	}
	if ps < minPageSize || ps > maxPageSize {
		return fmt.Errorf("meta page gives a page size of %d bytes, outside %d to %d", ps, minPageSize, maxPageSize)
	}
	v.ps = ps
	m0, err0 := v.metaAt(0)
	m1, err1 := v.metaAt(int64(ps))
	switch {
	case err0 != nil && err1 != nil:
		return fmt.Errorf("neither meta page is valid (page 0: %v; page 1: %v)", err0, err1)
	case err1 != nil || (err0 == nil && m0.txid >= m1.txid):
		v.m = m0
	default:
		v.m = m1
	}
	m := v.m
	switch {
	case m.pageSize != ps:
		return fmt.Errorf("meta page of transaction %d gives a page size of %d bytes, the file's is %d", m.txid, m.pageSize, ps)
	case m.hwm < 3:
		return fmt.Errorf("meta page of transaction %d counts %d pages, fewer than a bbolt file has", m.txid, m.hwm)
	case m.hwm > uint64(v.size)/ps:
		return fmt.Errorf("truncated: %d bytes, but the meta page of transaction %d counts %d pages of %d bytes (%d bytes)", v.size, m.txid, m.hwm, ps, m.hwm*ps)
	case m.root < 2 || m.root >= m.hwm:
		return fmt.Errorf("meta page of transaction %d puts the root bucket at page %d, outside pages 2 to %d", m.txid, m.root, m.hwm-1)
	case m.freelist != noFreelist && (m.freelist < 2 || m.freelist >= m.hwm):
		return fmt.Errorf("meta page of transaction %d puts the freelist at page %d, outside pages 2 to %d", m.txid, m.freelist, m.hwm-1)
	}
	return nil
}

// metaAt reads and checks the meta page at byte offset off.
func (v *verifier) metaAt(off int64) (meta, error) {
	if off >= v.size {
		return meta{}, fmt.Errorf("the file ends at byte %d, before the page at %d", v.size, off)
	}
	buf := make([]byte, min(v.size-off, 4096))
	if _, err := v.r.ReadAt(buf, off); err != nil && !errors.Is(err, io.EOF) {
		return meta{}, fmt.Errorf("read: %w", err)
	}
	return parseMeta(buf)
}

// page reads page id and its overflow pages, checking its header: it
// names itself id, has type flags, and ends below the high-water mark.
func (v *verifier) page(id uint64, flags uint16, what string) ([]byte, error) {
	var hdr [pageHeaderSize]byte
	if _, err := v.r.ReadAt(hdr[:], int64(id*v.ps)); err != nil {
		return nil, fmt.Errorf("page %d (%s): read: %w", id, what, err)
	}
	self, gotFlags, overflow := native.Uint64(hdr[0:]), native.Uint16(hdr[8:]), uint64(native.Uint32(hdr[12:]))
	switch {
	case self != id:
		return nil, fmt.Errorf("page %d (%s) names itself page %d", id, what, self)
	case gotFlags != flags:
		return nil, fmt.Errorf("page %d (%s) has type flags %#x, want %#x", id, what, gotFlags, flags)
	case id+overflow >= v.m.hwm:
		return nil, fmt.Errorf("page %d (%s) runs %d pages on, past the last page in use, %d", id, what, overflow, v.m.hwm-1)
	}
	for i := id; i <= id+overflow; i++ {
		switch v.pages[i] {
		case pageInUse:
			return nil, fmt.Errorf("page %d (%s) is also in use elsewhere", i, what)
		case pageFree:
			return nil, fmt.Errorf("page %d (%s) is in use but listed free", i, what)
		}
		v.pages[i] = pageInUse
	}
	buf := make([]byte, (overflow+1)*v.ps)
	if _, err := v.r.ReadAt(buf, int64(id*v.ps)); err != nil {
		return nil, fmt.Errorf("page %d (%s): read: %w", id, what, err)
	}
	return buf, nil
}

// readFreelist marks the free pages, checking that each lies below the
// high-water mark and is listed once.
func (v *verifier) readFreelist() error {
	p, err := v.page(v.m.freelist, freelistPageFlag, "freelist")
	if err != nil {
		return err
	}
	n, first := uint64(native.Uint16(p[10:])), uint64(pageHeaderSize)
	if n == 0xFFFF { // the count did not fit the header: it is the first id
		n, first = native.Uint64(p[pageHeaderSize:]), pageHeaderSize+8
	}
	if n > (uint64(len(p))-first)/8 {
		return fmt.Errorf("freelist page %d lists %d pages, more than it holds", v.m.freelist, n)
	}
	for i := range n {
		id := native.Uint64(p[first+8*i:])
		switch {
		case id < 2 || id >= v.m.hwm:
			return fmt.Errorf("freelist page %d lists page %d, outside pages 2 to %d", v.m.freelist, id, v.m.hwm-1)
		case v.pages[id] == pageFree:
			return fmt.Errorf("freelist page %d lists page %d twice", v.m.freelist, id)
		case v.pages[id] == pageInUse:
			return fmt.Errorf("freelist page %d lists page %d, which holds the freelist", v.m.freelist, id)
		}
		v.pages[id] = pageFree
	}
	return nil
}

// walkPage checks page id, a node of a bucket's tree whose keys lie in
// [lo, hi) (nil: unbounded), and the pages and buckets below it.
func (v *verifier) walkPage(id uint64, from string, depth int, lo, hi []byte) error {
	if id < 2 || id >= v.m.hwm {
		return fmt.Errorf("%s points to page %d, outside pages 2 to %d", from, id, v.m.hwm-1)
	}
	if depth > maxTreeDepth {
		return fmt.Errorf("%s points to page %d, %d levels deep: the tree loops", from, id, depth)
	}
	var hdr [pageHeaderSize]byte
	if _, err := v.r.ReadAt(hdr[:], int64(id*v.ps)); err != nil {
		return fmt.Errorf("page %d: read: %w", id, err)
	}
	flags := native.Uint16(hdr[8:])
	if flags != branchPageFlag && flags != leafPageFlag {
		return fmt.Errorf("%s points to page %d, which has type flags %#x, not a branch or leaf page", from, id, flags)
	}
	p, err := v.page(id, flags, "branch or leaf")
	if err != nil {
		return err
	}
	return v.walkNode(p, fmt.Sprintf("page %d", id), depth, lo, hi)
}

// walkNode checks a branch or leaf node laid out as a page in p (a page
// of the file, or a bucket's inline page): its elements lie within p,
// its keys are in order within [lo, hi), its children and buckets are
// sound.
func (v *verifier) walkNode(p []byte, where string, depth int, lo, hi []byte) error {
	if len(p) < pageHeaderSize {
		return fmt.Errorf("%s: %d bytes, too short for a page header", where, len(p))
	}
	flags, n := native.Uint16(p[8:]), uint64(native.Uint16(p[10:]))
	if flags != branchPageFlag && flags != leafPageFlag {
		return fmt.Errorf("%s has type flags %#x, not a branch or leaf page", where, flags)
	}
	size := uint64(len(p))
	if n > (size-pageHeaderSize)/elementSize {
		return fmt.Errorf("%s counts %d elements, more than it holds", where, n)
	}
	branch := flags == branchPageFlag
	if branch && n == 0 {
		return fmt.Errorf("%s is a branch page without elements", where)
	}
	// span returns p[off : off+n], or nil when it does not lie within p.
	span := func(off, n uint64) []byte {
		if off > size || n > size-off {
			return nil
		}
		return p[off : off+n]
	}
	keyAt := func(i uint64) ([]byte, error) {
		e := pageHeaderSize + i*elementSize
		pos, ksize := uint64(native.Uint32(p[e+4:])), uint64(native.Uint32(p[e+8:]))
		if branch {
			pos, ksize = uint64(native.Uint32(p[e:])), uint64(native.Uint32(p[e+4:]))
		}
		k := span(e+pos, ksize)
		switch {
		case k == nil:
			return nil, fmt.Errorf("%s: element %d's key (%d bytes at %d) runs past the page's %d bytes", where, i, ksize, e+pos, size)
		case len(k) == 0:
			return nil, fmt.Errorf("%s: element %d has an empty key", where, i)
		}
		return k, nil
	}
	prev := lo
	for i := range n {
		e := pageHeaderSize + i*elementSize
		k, err := keyAt(i)
		if err != nil {
			return err
		}
		if prev != nil && (bytes.Compare(k, prev) < 0 || (i > 0 && bytes.Equal(k, prev))) {
			return fmt.Errorf("%s: element %d's key %q is out of order (after %q)", where, i, k, prev)
		}
		if hi != nil && bytes.Compare(k, hi) >= 0 {
			return fmt.Errorf("%s: element %d's key %q is not below its parent's next key %q", where, i, k, hi)
		}
		prev = k
		if branch {
			next := hi
			if i+1 < n {
				if next, err = keyAt(i + 1); err != nil {
					return err
				}
			}
			child := native.Uint64(p[e+8:])
			if err := v.walkPage(child, fmt.Sprintf("%s element %d", where, i), depth+1, k, next); err != nil {
				return err
			}
			continue
		}
		eflags, pos, ksize, vsize := native.Uint32(p[e:]), uint64(native.Uint32(p[e+4:])), uint64(native.Uint32(p[e+8:])), uint64(native.Uint32(p[e+12:]))
		val := span(e+pos+ksize, vsize)
		switch {
		case val == nil:
			return fmt.Errorf("%s: element %d's value (%d bytes at %d) runs past the page's %d bytes", where, i, vsize, e+pos+ksize, size)
		case eflags&^bucketLeafFlag != 0:
			return fmt.Errorf("%s: element %d has flags %#x", where, i, eflags)
		case eflags != bucketLeafFlag:
			continue
		case len(val) < bucketHeaderSize:
			return fmt.Errorf("%s: bucket %q's header is %d bytes, want %d", where, k, len(val), bucketHeaderSize)
		}
		if root := native.Uint64(val); root != 0 {
			if err := v.walkPage(root, fmt.Sprintf("bucket %q (%s element %d)", k, where, i), depth+1, nil, nil); err != nil {
				return err
			}
			continue
		}
		inline := val[bucketHeaderSize:]
		if len(inline) < pageHeaderSize || native.Uint16(inline[8:]) != leafPageFlag {
			return fmt.Errorf("%s: bucket %q's inline page is not a leaf page", where, k)
		}
		if err := v.walkNode(inline, fmt.Sprintf("bucket %q's inline page (%s element %d)", k, where, i), depth+1, nil, nil); err != nil {
			return err
		}
	}
	return nil
}

// checkRecords reads every record of a file whose structure passed
// verifyFile: only the backlog's buckets, each record decodes under its
// id with a Seq the counter gave, each unfinished record is in open
// under its Seq and each final one in finished under its time, and the
// indexes hold nothing else.
func checkRecords(tx *bolt.Tx) error {
	err := tx.ForEach(func(name []byte, b *bolt.Bucket) error {
		if b == nil || !(bytes.Equal(name, ticketsBucket) || bytes.Equal(name, openBucket) || bytes.Equal(name, finishedBucket)) {
			return fmt.Errorf("the file holds %q, not one of the backlog's buckets", name)
		}
		return nil
	})
	if err != nil {
		return err
	}
	tickets, open, finished := tx.Bucket(ticketsBucket), tx.Bucket(openBucket), tx.Bucket(finishedBucket)
	if tickets == nil {
		if indexLen(open) > 0 || indexLen(finished) > 0 {
			return errors.New("its indexes hold tickets, but it has no tickets bucket")
		}
		return nil
	}
	var unfinished, final int
	counter := tickets.Sequence()
	err = tickets.ForEach(func(k, val []byte) error {
		if val == nil {
			return fmt.Errorf("tickets holds a bucket %q", k)
		}
		rec, err := decode(val)
		switch {
		case err != nil:
			return fmt.Errorf("ticket %q: %w", k, err)
		case rec.ID != string(k):
			return fmt.Errorf("ticket %q: its record is ticket %q's", k, rec.ID)
		case rec.Seq == 0 || rec.Seq > counter:
			return fmt.Errorf("ticket %q: seq %d, outside 1 to the counter's %d", k, rec.Seq, counter)
		case rec.State < deferral.StatePending || rec.State > deferral.StateCancelled:
			return fmt.Errorf("ticket %q: unknown state %d", k, rec.State)
		case rec.State.Final():
			final++
			if !has(finished, finishedKey(rec.Finished, rec.ID)) {
				return fmt.Errorf("ticket %q is %s but not in the finished index", k, rec.State)
			}
		default:
			unfinished++
			if open == nil || !bytes.Equal(open.Get(seqKey(rec.Seq)), k) {
				return fmt.Errorf("ticket %q is %s but not in the open index under its seq %d", k, rec.State, rec.Seq)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if n := indexLen(open); n != unfinished {
		return fmt.Errorf("the open index holds %d entries for %d unfinished tickets", n, unfinished)
	}
	if n := indexLen(finished); n != final {
		return fmt.Errorf("the finished index holds %d entries for %d final tickets", n, final)
	}
	if finished != nil {
		c := finished.Cursor()
		for k, val := c.First(); k != nil; k, val = c.Next() {
			if len(val) != 0 {
				return fmt.Errorf("the finished index holds a value of %d bytes under %q, where it keeps none", len(val), k)
			}
		}
	}
	return nil
}

// has reports whether b holds key (with any value, empty included).
func has(b *bolt.Bucket, key []byte) bool {
	if b == nil {
		return false
	}
	k, _ := b.Cursor().Seek(key)
	return bytes.Equal(k, key)
}

// indexLen counts b's keys.
func indexLen(b *bolt.Bucket) int {
	if b == nil {
		return 0
	}
	n := 0
	c := b.Cursor()
	for k, _ := c.First(); k != nil; k, _ = c.Next() {
		n++
	}
	return n
}

// errPanicked marks the error of a panic guarded caught.
var errPanicked = errors.New("bbolt failed reading it")

// guarded runs fn with memory faults turned into panics (bbolt reads the
// file through a memory map), and returns a panic as an errPanicked.
func guarded(fn func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v", errPanicked, r)
		}
	}()
	return fn()
}
