package inbox

import (
	"strings"
	"testing"
)

func TestSubscriptionPrecedence(t *testing.T) {
	subs, err := ParseSubscriptions([]string{"a/#", "a/+/c", "a/b/c", "+/+/c", "$share/g/s/#", "#", "$SYS/x"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ topic, want string }{
		{"a/b/c", "a/b/c"}, // exact beats + and #
		{"a/x/c", "a/+/c"}, // + beats #; first + declared wins over +/+/c
		{"z/x/c", "+/+/c"}, // + beats the # of "#"
		{"a/x", "a/#"},     // # of a/# declared before "#"
		{"a", "a/#"},       // a/# matches its parent level
		{"s/1/2", "$share/g/s/#"},
		{"q", "#"},
		{"$SYS/x", "$SYS/x"}, // only a filter naming $SYS matches it
		{"$SYS/y", ""},       // wildcards at the first level never match $ topics
	} {
		got, ok := subs.Match(tc.topic)
		if tc.want == "" {
			if ok {
				t.Errorf("%q matched %q, want no match", tc.topic, got.Raw)
			}
			continue
		}
		if !ok || got.Raw != tc.want {
			t.Errorf("%q matched %q (ok %v), want %q", tc.topic, got.Raw, ok, tc.want)
		}
	}
}

func TestInvalidTopicFiltersAreRejected(t *testing.T) {
	for _, tc := range []struct {
		topics []string
		want   string
	}{
		{nil, "at least one"},
		{[]string{""}, "must not be empty"},
		{[]string{"a/#/b"}, "'#' must be a whole level"},
		{[]string{"a#"}, "'#' must be a whole level"},
		{[]string{"a/b+"}, "'+' must be a whole level"},
		{[]string{"$share/g"}, "$share/<group>/<filter>"},
		{[]string{"$share//a"}, "$share/<group>/<filter>"},
		{[]string{"$share/g+/a"}, "group name"},
		{[]string{"a/b", "a/b"}, "listed twice"},
		{[]string{"a\x00b"}, "NUL"},
	} {
		_, err := ParseSubscriptions(tc.topics)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("topics %q: error %v, want one containing %q", tc.topics, err, tc.want)
		}
	}
}
