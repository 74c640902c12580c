package sqlledger

import "strings"

// txControlWords start statements that would end or split the processor's
// transaction: a COMMIT inside apply would make the ledger row and the
// effect durable before the rest ran, which is the bug this store exists
// to prevent.
var txControlWords = map[string]bool{
	"BEGIN": true, "COMMIT": true, "ROLLBACK": true, "SAVEPOINT": true,
	"RELEASE": true, "END": true, "START": true, "ABORT": true,
}

// TxControlIn reports whether any statement in query (split on semicolons
// outside quotes and comments) starts with a transaction-control keyword.
func TxControlIn(query string) (string, bool) {
	for _, st := range splitStatements(query) {
		if w := strings.ToUpper(firstWord(st)); txControlWords[w] {
			return w, true
		}
	}
	return "", false
}

// splitStatements splits on ';' outside '…', "…", -- and /* */ comments
// and removes comments, which is enough to find each statement's first
// word.
func splitStatements(q string) []string {
	var out []string
	var cur strings.Builder
	for i := 0; i < len(q); i++ {
		c := q[i]
		switch {
		case c == '\'' || c == '"':
			j := i + 1
			for j < len(q) && q[j] != c {
				j++
			}
			cur.WriteString(q[i:min(j+1, len(q))])
			i = j
		case c == '-' && i+1 < len(q) && q[i+1] == '-':
			for i < len(q) && q[i] != '\n' {
				i++
			}
			cur.WriteByte(' ')
		case c == '/' && i+1 < len(q) && q[i+1] == '*':
			end := strings.Index(q[i+2:], "*/")
			if end < 0 {
				i = len(q)
			} else {
				i += end + 3
			}
			cur.WriteByte(' ')
		case c == ';':
			out = append(out, cur.String())
			cur.Reset()
		default:
			cur.WriteByte(c)
		}
	}
	return append(out, cur.String())
}

func firstWord(s string) string {
	s = strings.TrimLeft(s, " \t\r\n(")
	end := strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r == '_')
	})
	if end < 0 {
		return s
	}
	return s[:end]
}
