package gateway

import (
	"encoding/binary"
	"math/bits"
	"unsafe"

	"github.com/tidwall/gjson"
)

// A small JSON scanner: it validates as it walks (RFC 8259's grammar, as
// encoding/json.Valid reads it) and reports where values lie, without
// building anything. ParseBody walks a body's top-level keys with it in
// one pass; nesting is followed with an explicit stack, so a deep body
// grows no goroutine stack.

// skipSpace returns the index of the first byte at or after i that is not
// JSON whitespace.
func skipSpace(d []byte, i int) int {
	for i < len(d) {
		switch d[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// stringStop marks the bytes that end a run of plain string bytes: the
// closing quote, an escape, a control character.
var stringStop = func() (t [256]bool) {
	for c := range 0x20 {
		t[c] = true
	}
	t['"'], t['\\'] = true, true
	return t
}()

// Eight bytes at a time: the bytes of a word that are a quote, a
// backslash or below 0x20 have their high bit set in stopBits. A byte
// above a marked one may be marked falsely (a borrow runs on), never one
// below it, so the lowest mark is exact.
const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
)

func stopBits(w uint64) uint64 {
	q := w ^ (ones * '"')
	b := w ^ (ones * '\\')
	return ((q-ones)&^q | (b-ones)&^b | (w-ones*0x20)&^w) & highs
}

// scanString reads the string whose opening quote is d[i]: end is just
// past its closing quote; escaped: it holds an escape.
func scanString(d []byte, i int) (end int, escaped, ok bool) {
	i++
	for {
		for i+8 <= len(d) {
			if m := stopBits(binary.LittleEndian.Uint64(d[i:])); m != 0 {
				i += bits.TrailingZeros64(m) / 8
				break
			}
			i += 8
		}
		for i < len(d) && !stringStop[d[i]] {
			i++
		}
		if i >= len(d) {
			return i, escaped, false
		}
		switch d[i] {
		case '"':
			return i + 1, escaped, true
		case '\\':
			escaped = true
			i++
			if i >= len(d) {
				return i, true, false
			}
			switch d[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i++
			case 'u':
				if i+4 >= len(d) || !isHex(d[i+1]) || !isHex(d[i+2]) || !isHex(d[i+3]) || !isHex(d[i+4]) {
					return i, true, false
				}
				i += 5
			default:
				return i, true, false
			}
		default: // a control character
			return i, escaped, false
		}
	}
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// scanNumber reads the number that starts at d[i]: -?(0|[1-9][0-9]*)
// (.[0-9]+)?([eE][+-]?[0-9]+)?
func scanNumber(d []byte, i int) (int, bool) {
	if i < len(d) && d[i] == '-' {
		i++
	}
	switch {
	case i >= len(d):
		return i, false
	case d[i] == '0':
		i++
	case isDigit(d[i]):
		for i < len(d) && isDigit(d[i]) {
			i++
		}
	default:
		return i, false
	}
	if i < len(d) && d[i] == '.' {
		i++
		if i >= len(d) || !isDigit(d[i]) {
			return i, false
		}
		for i < len(d) && isDigit(d[i]) {
			i++
		}
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		if i >= len(d) || !isDigit(d[i]) {
			return i, false
		}
		for i < len(d) && isDigit(d[i]) {
			i++
		}
	}
	return i, true
}

// scanLiteral reads lit (true, false or null) at d[i].
func scanLiteral(d []byte, i int, lit string) (int, bool) {
	if len(d)-i < len(lit) || string(d[i:i+len(lit)]) != lit {
		return i, false
	}
	return i + len(lit), true
}

// scanKey reads an object's key at d[i] and the colon after it: key is
// the key's text between its quotes (escapes as written), next the first
// byte of its value.
func scanKey(d []byte, i int) (key []byte, escaped bool, next int, ok bool) {
	if i >= len(d) || d[i] != '"' {
		return nil, false, i, false
	}
	end, escaped, ok := scanString(d, i)
	if !ok {
		return nil, false, end, false
	}
	key = d[i+1 : end-1]
	i = skipSpace(d, end)
	if i >= len(d) || d[i] != ':' {
		return nil, false, i, false
	}
	return key, escaped, skipSpace(d, i+1), true
}

// keyIs reports whether a key as written (escaped: with escapes) is name.
func keyIs(key []byte, escaped bool, name string) bool {
	if !escaped {
		return string(key) == name
	}
	return unescapedKey(key) == name
}

// unescapedKey is key's text with its escapes read: rare in a request, so
// gjson reads them.
func unescapedKey(key []byte) string {
	q := make([]byte, 0, len(key)+2)
	q = append(append(append(q, '"'), key...), '"')
	return gjson.ParseBytes(q).Str
}

// unquote is the text of the JSON string raw (quotes included).
func unquote(raw []byte, escaped bool) string {
	if !escaped {
		return string(raw[1 : len(raw)-1])
	}
	return gjson.Parse(unsafe.String(&raw[0], len(raw))).Str
}

// skipValue reads the value that starts at d[i] (after any whitespace)
// and returns the index just past it.
func skipValue(d []byte, i int) (int, bool) {
	var stackSpace [32]byte
	stack := stackSpace[:0] // the open containers: '{' or '['
	for {
		// A value.
		i = skipSpace(d, i)
		if i >= len(d) {
			return i, false
		}
		var ok bool
		switch c := d[i]; c {
		case '{', '[':
			closer := byte('}')
			if c == '[' {
				closer = ']'
			}
			j := skipSpace(d, i+1)
			if j < len(d) && d[j] == closer {
				i, ok = j+1, true
				break
			}
			stack = append(stack, c)
			if c == '[' {
				i = j
				continue
			}
			if _, _, i, ok = scanKey(d, j); !ok {
				return i, false
			}
			continue
		case '"':
			i, _, ok = scanString(d, i)
		case 't':
			i, ok = scanLiteral(d, i, "true")
		case 'f':
			i, ok = scanLiteral(d, i, "false")
		case 'n':
			i, ok = scanLiteral(d, i, "null")
		default:
			i, ok = scanNumber(d, i)
		}
		if !ok {
			return i, false
		}
		// After a value: close what ends here, then the next element.
		for {
			if len(stack) == 0 {
				return i, true
			}
			i = skipSpace(d, i)
			if i >= len(d) {
				return i, false
			}
			top := stack[len(stack)-1]
			if d[i] == ',' {
				i++
				if top == '{' {
					if _, _, i, ok = scanKey(d, skipSpace(d, i)); !ok {
						return i, false
					}
				}
				break
			}
			if top == '{' && d[i] == '}' || top == '[' && d[i] == ']' {
				stack = stack[:len(stack)-1]
				i++
				continue
			}
			return i, false
		}
	}
}

// jsonKind is a JSON value's type, told by its first byte.
type jsonKind byte

// The JSON kinds.
const (
	kindNone jsonKind = iota
	kindString
	kindNumber
	kindObject
	kindArray
	kindTrue
	kindFalse
	kindNull
)

func kindOf(c byte) jsonKind {
	switch c {
	case '"':
		return kindString
	case '{':
		return kindObject
	case '[':
		return kindArray
	case 't':
		return kindTrue
	case 'f':
		return kindFalse
	case 'n':
		return kindNull
	}
	return kindNumber
}

// objectMembers walks the object at d[i] ('{' there): member is called
// with each key and the start of its value, and returns the index just
// past the value (it reads the value, with skipValue or its own walk);
// the walk returns the index just past the object.
func objectMembers(d []byte, i int, member func(key []byte, escaped bool, at int) (int, bool)) (int, bool) {
	i = skipSpace(d, i+1)
	if i < len(d) && d[i] == '}' {
		return i + 1, true
	}
	for {
		key, escaped, at, ok := scanKey(d, i)
		if !ok {
			return at, false
		}
		if i, ok = member(key, escaped, at); !ok {
			return i, false
		}
		i = skipSpace(d, i)
		if i >= len(d) {
			return i, false
		}
		switch d[i] {
		case ',':
			i = skipSpace(d, i+1)
		case '}':
			return i + 1, true
		default:
			return i, false
		}
	}
}
