package sqlledger

import "testing"

// Words inside strings and identifiers are not transaction control.
func TestTxControlInIgnoresStringsAndIdentifiers(t *testing.T) {
	for _, q := range []string{
		"UPDATE notes SET body = 'commit; begin' WHERE id = ?",
		"INSERT INTO ends (x) VALUES (?)",
		"UPDATE c SET v = v + 1;",
	} {
		if w, bad := TxControlIn(q); bad {
			t.Errorf("%q refused as transaction control (%s)", q, w)
		}
	}
}
