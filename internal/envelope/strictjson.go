package envelope

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf16"
	"unicode/utf8"
)

// The strict parser accepts exactly what reliomq's decoder accepts: Python
// json.loads on the UTF-8-decoded bytes, with duplicate keys and the
// NaN/Infinity literals rejected, followed by reliomq's check that every
// number is finite and every string can be encoded as UTF-8. In JSON terms:
//
//   - the input is valid UTF-8 (no byte order mark) holding one RFC 8259
//     value, with only space, tab, CR and LF around and between tokens;
//   - no object has two keys that are equal after unescaping, at any depth;
//   - no NaN, Infinity or -Infinity, and no number that overflows to
//     infinity (1e400); underflow to zero (1e-400) is fine, as in Python;
//   - no integer longer than 4300 digits (Python's int/str conversion limit);
//   - no \uXXXX escape that leaves an unpaired UTF-16 surrogate;
//   - nesting at most MaxPayloadDepth levels inside a message (see there).

// MaxPayloadDepth is how deeply arrays and objects may nest in a payload.
// Python bounds nesting only by its recursion limit (1000 frames), which the
// decoder, reliomq's validator and json.dumps all share with whatever is
// already on the call stack, so reliomq's real limit is a little below 1000
// and varies. 900 stays safely under it: everything we accept or emit,
// reliomq accepts too.
const MaxPayloadDepth = 900

// maxIntDigits is Python's default sys.get_int_max_str_digits(): json.loads
// raises on longer integer literals and json.dumps cannot print them.
const maxIntDigits = 4300

type kind uint8

const (
	kindNull kind = iota
	kindBool
	kindNumber
	kindString
	kindArray
	kindObject
)

func (k kind) String() string {
	return [...]string{"null", "boolean", "number", "string", "array", "object"}[k]
}

// value is a parsed JSON value.
type value struct {
	kind kind
	// text is the unescaped string for kindString, the canonical (Python)
	// form of a number for kindNumber, and "true"/"false"/"null" otherwise.
	text    string
	isFloat bool     // number written with '.', 'e' or 'E' (a Python float)
	elems   []value  // kindArray
	members []member // kindObject, sorted by key (code point order)
}

type member struct {
	key    string
	val    value
	offset int // where the key starts, for error messages
}

// syntaxError says what is wrong and at which byte offset.
type syntaxError struct {
	msg    string
	offset int
}

func (e *syntaxError) Error() string { return fmt.Sprintf("%s at offset %d", e.msg, e.offset) }

type parser struct {
	data []byte
	// src is data as one string: strings without escapes and numbers
	// already in canonical form are substrings of it, so a value costs no
	// allocation of its own. Strings that leave the package (event IDs,
	// topics, trace keys) are cloned so they do not pin the whole message.
	src      string
	pos      int
	depth    int
	maxDepth int
	// elems and members are stacks the open containers share: children
	// collect here and move into one exactly sized slice when their
	// container closes, instead of growing a slice per container.
	elems   []value
	members []member
}

// parseStrict parses data as one strict JSON value. envelopeLevels is how
// many levels of arrays and objects wrap the payload (1 for a message, 0
// for a bare payload); the payload may nest MaxPayloadDepth more.
func parseStrict(data []byte, envelopeLevels int) (value, error) {
	if !utf8.Valid(data) {
		off := 0
		for off < len(data) {
			r, n := utf8.DecodeRune(data[off:])
			if r == utf8.RuneError && n <= 1 {
				break
			}
			off += n
		}
		return value{}, &syntaxError{"invalid UTF-8", off}
	}
	p := parsers.Get().(*parser)
	defer p.release()
	p.data, p.src, p.pos, p.depth, p.maxDepth = data, string(data), 0, 0, MaxPayloadDepth+envelopeLevels
	p.skipSpace()
	if p.pos == len(data) {
		return value{}, &syntaxError{"no JSON value (empty input)", p.pos}
	}
	v, err := p.parseValue()
	if err != nil {
		return value{}, err
	}
	p.skipSpace()
	if p.pos != len(data) {
		return value{}, p.errorf("extra data after the JSON value")
	}
	return v, nil
}

// parsers keeps parsers with their stacks between payloads, so a reading
// costs no stack growth.
var parsers = sync.Pool{New: func() any { return new(parser) }}

// maxPooledStack bounds the stacks a pooled parser keeps: a huge payload's
// are left to the garbage collector.
const maxPooledStack = 256

// release forgets the payload and returns p to the pool (popChildren
// cleared the stacks, whose old entries would pin the payload's strings).
func (p *parser) release() {
	if cap(p.elems) > maxPooledStack || cap(p.members) > maxPooledStack {
		return
	}
	*p = parser{elems: p.elems[:0], members: p.members[:0]}
	parsers.Put(p)
}

func (p *parser) errorf(format string, args ...any) error {
	return &syntaxError{fmt.Sprintf(format, args...), p.pos}
}

// skipSpace skips JSON whitespace; Python's json accepts exactly these four.
func (p *parser) skipSpace() {
	for p.pos < len(p.data) {
		switch p.data[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

// parseValue and the parse functions it calls return values rather than
// fill in pointers: a pointer passed down the recursion would make every
// value escape to the heap.
func (p *parser) parseValue() (value, error) {
	rest := p.data[p.pos:]
	switch c := rest[0]; {
	case c == '{':
		return p.parseObject()
	case c == '[':
		return p.parseArray()
	case c == '"':
		s, err := p.parseString()
		return value{kind: kindString, text: s}, err
	case c == '-' || c >= '0' && c <= '9':
		if hasPrefix(rest, "-Infinity") {
			return value{}, p.errorf("-Infinity is not allowed")
		}
		return p.parseNumber()
	case hasPrefix(rest, "true"):
		p.pos += 4
		return value{kind: kindBool, text: "true"}, nil
	case hasPrefix(rest, "false"):
		p.pos += 5
		return value{kind: kindBool, text: "false"}, nil
	case hasPrefix(rest, "null"):
		p.pos += 4
		return value{kind: kindNull, text: "null"}, nil
	case hasPrefix(rest, "NaN"):
		return value{}, p.errorf("NaN is not allowed")
	case hasPrefix(rest, "Infinity"):
		return value{}, p.errorf("Infinity is not allowed")
	case hasPrefix(rest, "\uFEFF"):
		return value{}, p.errorf("UTF-8 byte order mark is not allowed")
	default:
		r, _ := utf8.DecodeRune(rest)
		return value{}, p.errorf("invalid character %q, expecting a JSON value", r)
	}
}

func hasPrefix(b []byte, s string) bool { return len(b) >= len(s) && string(b[:len(s)]) == s }

func (p *parser) enter() error {
	p.depth++
	if p.depth > p.maxDepth {
		return p.errorf("payload nests arrays and objects more than %d levels deep", MaxPayloadDepth)
	}
	return nil
}

func (p *parser) parseArray() (value, error) {
	base := len(p.elems)
	err := p.parseContainer(']', "a JSON value", func() error {
		e, err := p.parseValue()
		p.elems = append(p.elems, e)
		return err
	})
	return value{kind: kindArray, elems: popChildren(&p.elems, base, err == nil)}, err
}

func (p *parser) parseObject() (value, error) {
	base := len(p.members)
	err := p.parseContainer('}', "an object key", func() error {
		if p.data[p.pos] != '"' {
			return p.errorf("invalid character %q, expecting a double-quoted object key", p.peekRune())
		}
		m := member{offset: p.pos}
		key, err := p.parseString()
		if err != nil {
			return err
		}
		m.key = key
		p.skipSpace()
		if p.pos == len(p.data) || p.data[p.pos] != ':' {
			if p.pos == len(p.data) {
				return p.errorf("unexpected end of input, expecting ':'")
			}
			return p.errorf("invalid character %q, expecting ':'", p.peekRune())
		}
		p.pos++
		p.skipSpace()
		if p.pos == len(p.data) {
			return p.errorf("unexpected end of input, expecting a JSON value")
		}
		if m.val, err = p.parseValue(); err != nil {
			return err
		}
		p.members = append(p.members, m)
		return nil
	})
	v := value{kind: kindObject, members: popChildren(&p.members, base, err == nil)}
	if err != nil {
		return v, err
	}
	return v, sortMembers(v.members)
}

// popChildren takes the children a container pushed on stack since base
// off it, returning them in their own slice when keep is set.
func popChildren[T any](stack *[]T, base int, keep bool) []T {
	var out []T
	if keep && len(*stack) > base {
		out = slices.Clone((*stack)[base:])
	}
	clear((*stack)[base:])
	*stack = (*stack)[:base]
	return out
}

// parseContainer parses an array or object from its opening byte at p.pos
// to end: elem parses one element (spaces skipped, input not at its end),
// and elements are separated by commas.
func (p *parser) parseContainer(end byte, first string, elem func() error) error {
	if err := p.enter(); err != nil {
		return err
	}
	p.pos++ // '[' or '{'
	p.skipSpace()
	if p.pos < len(p.data) && p.data[p.pos] == end {
		p.pos++
		p.depth--
		return nil
	}
	for {
		p.skipSpace()
		if p.pos == len(p.data) {
			return p.errorf("unexpected end of input, expecting %s", first)
		}
		if err := elem(); err != nil {
			return err
		}
		p.skipSpace()
		if p.pos == len(p.data) {
			return p.errorf("unexpected end of input, expecting ',' or '%c'", end)
		}
		switch p.data[p.pos] {
		case ',':
			p.pos++
		case end:
			p.pos++
			p.depth--
			return nil
		default:
			return p.errorf("invalid character %q, expecting ',' or '%c'", p.peekRune(), end)
		}
	}
}

// sortMembers puts members in canonical order (Python sorts str keys by code
// point; for valid UTF-8, Go's byte order is the same order) and rejects
// duplicate keys, reporting the one that appears first in the input.
func sortMembers(ms []member) error {
	slices.SortStableFunc(ms, func(a, b member) int { return strings.Compare(a.key, b.key) })
	dup := -1
	for i := 1; i < len(ms); i++ {
		if ms[i].key == ms[i-1].key && (dup < 0 || ms[i].offset < ms[dup].offset) {
			dup = i
		}
	}
	if dup >= 0 {
		return &syntaxError{fmt.Sprintf("duplicate key %s", quoteShort(ms[dup].key)), ms[dup].offset}
	}
	return nil
}

func (p *parser) peekRune() rune {
	r, _ := utf8.DecodeRune(p.data[p.pos:])
	return r
}

// parseString parses a string starting at the opening quote and returns it
// unescaped. The input is already known to be valid UTF-8.
func (p *parser) parseString() (string, error) {
	p.pos++ // opening quote
	start := p.pos
	// Fast path: no escapes.
	for p.pos < len(p.data) {
		c := p.data[p.pos]
		if c == '"' {
			s := p.src[start:p.pos]
			p.pos++
			return s, nil
		}
		if c == '\\' {
			break
		}
		if c < 0x20 {
			return "", p.errorf("unescaped control character %q in string", rune(c))
		}
		p.pos++
	}
	buf := append([]byte(nil), p.data[start:p.pos]...)
	for p.pos < len(p.data) {
		c := p.data[p.pos]
		switch {
		case c == '"':
			p.pos++
			return string(buf), nil
		case c < 0x20:
			return "", p.errorf("unescaped control character %q in string", rune(c))
		case c != '\\':
			buf = append(buf, c)
			p.pos++
			continue
		}
		if p.pos+1 == len(p.data) {
			break
		}
		esc := p.data[p.pos+1]
		switch esc {
		case '"', '\\', '/':
			buf = append(buf, esc)
		case 'b':
			buf = append(buf, '\b')
		case 'f':
			buf = append(buf, '\f')
		case 'n':
			buf = append(buf, '\n')
		case 'r':
			buf = append(buf, '\r')
		case 't':
			buf = append(buf, '\t')
		case 'u':
			r, n, err := p.parseUnicodeEscape()
			if err != nil {
				return "", err
			}
			buf = utf8.AppendRune(buf, r)
			p.pos += n
			continue
		default:
			return "", p.errorf("invalid escape %q in string", "\\"+string(rune(esc)))
		}
		p.pos += 2
	}
	return "", p.errorf("unexpected end of input inside a string")
}

// parseUnicodeEscape decodes \uXXXX at p.pos, joining a surrogate pair
// written as two escapes the way Python does. It returns the rune and how
// many input bytes it used. An unpaired surrogate is an error: Python
// decodes it into a str that cannot be encoded as UTF-8, which reliomq
// rejects.
func (p *parser) parseUnicodeEscape() (rune, int, error) {
	r, ok := hex4(p.data[p.pos+2:])
	if !ok {
		return 0, 0, p.errorf("invalid \\uXXXX escape")
	}
	switch {
	case r >= 0xD800 && r <= 0xDBFF:
		rest := p.data[p.pos+6:]
		if len(rest) >= 2 && rest[0] == '\\' && rest[1] == 'u' {
			low, ok := hex4(rest[2:])
			if !ok {
				return 0, 0, &syntaxError{"invalid \\uXXXX escape", p.pos + 6}
			}
			if low >= 0xDC00 && low <= 0xDFFF {
				return utf16.DecodeRune(r, low), 12, nil
			}
		}
		return 0, 0, p.errorf("unpaired UTF-16 surrogate \\u%04x in string (it has no UTF-8 form)", r)
	case r >= 0xDC00 && r <= 0xDFFF:
		return 0, 0, p.errorf("unpaired UTF-16 surrogate \\u%04x in string (it has no UTF-8 form)", r)
	}
	return r, 6, nil
}

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// parseNumber parses an RFC 8259 number and returns it in canonical form.
func (p *parser) parseNumber() (value, error) {
	start := p.pos
	d := p.data
	if d[p.pos] == '-' {
		p.pos++
	}
	digitsStart := p.pos
	switch {
	case p.pos < len(d) && d[p.pos] == '0':
		p.pos++
	case p.pos < len(d) && d[p.pos] >= '1' && d[p.pos] <= '9':
		for p.pos < len(d) && d[p.pos] >= '0' && d[p.pos] <= '9' {
			p.pos++
		}
	default:
		return value{}, p.errorf("invalid number: expecting a digit")
	}
	intDigits := p.pos - digitsStart
	isFloat := false
	if p.pos < len(d) && d[p.pos] == '.' {
		isFloat = true
		p.pos++
		if !p.digits() {
			return value{}, p.errorf("invalid number: expecting a digit after the decimal point")
		}
	}
	if p.pos < len(d) && (d[p.pos] == 'e' || d[p.pos] == 'E') {
		isFloat = true
		p.pos++
		if p.pos < len(d) && (d[p.pos] == '+' || d[p.pos] == '-') {
			p.pos++
		}
		if !p.digits() {
			return value{}, p.errorf("invalid number: expecting a digit in the exponent")
		}
	}
	text := p.src[start:p.pos]
	if !isFloat {
		if intDigits > maxIntDigits {
			return value{}, &syntaxError{fmt.Sprintf("integer has %d digits; reliomq (Python) accepts at most %d", intDigits, maxIntDigits), start}
		}
		if text == "-0" { // Python: int("-0") == 0, printed "0"
			text = "0"
		}
		return value{kind: kindNumber, text: text}, nil
	}
	f, _ := strconv.ParseFloat(text, 64) // syntax already checked; range checked below
	if math.IsInf(f, 0) {
		short := text
		if len(short) > 40 {
			short = short[:40] + "…"
		}
		return value{}, &syntaxError{fmt.Sprintf("number %s overflows to infinity", short), start}
	}
	var buf [32]byte
	if repr := appendPythonFloat(buf[:0], f); string(repr) != text {
		text = string(repr)
	}
	return value{kind: kindNumber, text: text, isFloat: true}, nil
}

// digits consumes one or more ASCII digits and reports whether there was one.
func (p *parser) digits() bool {
	start := p.pos
	for p.pos < len(p.data) && p.data[p.pos] >= '0' && p.data[p.pos] <= '9' {
		p.pos++
	}
	return p.pos > start
}
