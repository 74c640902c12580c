package envelope

import (
	"bytes"
	"strconv"
)

// Canonical form is what Python's
//
//	json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
//
// prints for the value Python's json.loads made of the input:
//
//   - object keys sorted by code point, no whitespace anywhere;
//   - strings escape only '"', '\\' and control characters below 0x20
//     (\b \f \n \r \t short, the rest as lowercase \u00XX); everything else,
//     including U+2028, U+2029, '<', '>', '&' and DEL, stays as raw UTF-8;
//   - integers print their digits as written (Python ints are unbounded),
//     except that -0 is the int 0;
//   - floats print as Python's float repr (see appendPythonFloat).
//
// encoding/json escapes differently, so this file writes the bytes itself.

// Canonical parses payload as strict JSON (the rules in strictjson.go) and
// returns its canonical form.
func Canonical(payload []byte) ([]byte, error) {
	return appendCanonical(make([]byte, 0, len(payload)), payload)
}

// appendCanonical appends payload's canonical form to dst.
func appendCanonical(dst, payload []byte) ([]byte, error) {
	v, err := parseStrict(payload, 0)
	if err != nil {
		return nil, malformedf("payload is not strict JSON: %v", err)
	}
	return appendValue(dst, &v), nil
}

func appendValue(dst []byte, v *value) []byte {
	switch v.kind {
	case kindString:
		return appendString(dst, v.text)
	case kindArray:
		dst = append(dst, '[')
		for i := range v.elems {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendValue(dst, &v.elems[i])
		}
		return append(dst, ']')
	case kindObject:
		// members are already sorted by the parser.
		dst = append(dst, '{')
		for i := range v.members {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendString(dst, v.members[i].key)
			dst = append(dst, ':')
			dst = appendValue(dst, &v.members[i].val)
		}
		return append(dst, '}')
	default: // null, bool, number: text is already canonical
		return append(dst, v.text...)
	}
}

const lowerHex = "0123456789abcdef"

// shortEscape is the letter of a two-character escape (\n, \"), where
// JSON has one; other control characters are written \u00XX.
var shortEscape = [256]byte{'"': '"', '\\': '\\', '\n': 'n', '\r': 'r', '\t': 't', '\b': 'b', '\f': 'f'}

// appendString writes s as a JSON string the way Python does with
// ensure_ascii=False. s must be valid UTF-8 (callers check).
func appendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		dst = append(dst, s[start:i]...)
		if e := shortEscape[c]; e != 0 {
			dst = append(dst, '\\', e)
		} else {
			dst = append(dst, '\\', 'u', '0', '0', lowerHex[c>>4], lowerHex[c&0xf])
		}
		start = i + 1
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// appendPythonFloat appends a finite f as Python's repr(float) prints it:
// the shortest digits that round-trip (strconv's -1 precision finds the
// same digits), in fixed notation with at least one fractional digit when
// the decimal exponent is in [-4, 16), otherwise in scientific notation with
// a signed exponent of at least two digits: 25.2, 1.0, 0.0001, -0.0, 1e+16,
// 1e-05, 1.5e+300.
func appendPythonFloat(dst []byte, f float64) []byte {
	start := len(dst)
	dst = strconv.AppendFloat(dst, f, 'e', -1, 64) // d[.ddd]e±XX, at least 2 exponent digits, like Python
	e := start + bytes.IndexByte(dst[start:], 'e')
	exp := 0
	for _, c := range dst[e+2:] {
		exp = exp*10 + int(c-'0')
	}
	if dst[e+1] == '-' {
		exp = -exp
	}
	if exp < -4 || exp >= 16 {
		return dst
	}
	dst = strconv.AppendFloat(dst[:start], f, 'f', -1, 64)
	if bytes.IndexByte(dst[start:], '.') < 0 {
		dst = append(dst, '.', '0')
	}
	return dst
}
