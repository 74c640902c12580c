package inbox

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// maxFilterBytes is the longest topic filter an MQTT packet can carry.
const maxFilterBytes = 65535

// Filter specificity classes: a lower class wins when several filters match.
const (
	classExact = iota // no wildcard
	classPlus         // '+' but no '#'
	classHash         // '#' (possibly with '+')
)

// Subscription is one configured entry of `topics`.
type Subscription struct {
	Raw    string   // as configured, e.g. "$share/g/a/+"; what the broker gets and mqtt_subscription reports
	levels []string // the filter part split on '/', e.g. ["a", "+"]
	class  int
	order  int // position in `topics`
}

// Subscriptions are the configured filters, checked once at config time.
type Subscriptions []Subscription

// ParseSubscriptions validates every filter of `topics`.
func ParseSubscriptions(topics []string) (Subscriptions, error) {
	if len(topics) == 0 {
		return nil, errors.New("topics: at least one topic filter is required")
	}
	seen := make(map[string]bool, len(topics))
	subs := make(Subscriptions, 0, len(topics))
	for i, raw := range topics {
		if seen[raw] {
			return nil, fmt.Errorf("topics: filter %q is listed twice; list each filter once", raw)
		}
		seen[raw] = true
		filter, err := splitShared(raw)
		if err != nil {
			return nil, fmt.Errorf("topics: %w", err)
		}
		if err := checkFilter(filter); err != nil {
			return nil, fmt.Errorf("topics: filter %q: %w", raw, err)
		}
		s := Subscription{Raw: raw, levels: strings.Split(filter, "/"), order: i}
		switch {
		case strings.Contains(filter, "#"):
			s.class = classHash
		case strings.Contains(filter, "+"):
			s.class = classPlus
		default:
			s.class = classExact
		}
		subs = append(subs, s)
	}
	return subs, nil
}

// splitShared returns the filter part of a shared subscription
// ($share/<group>/<filter>), or raw itself when it is not shared.
func splitShared(raw string) (string, error) {
	if !strings.HasPrefix(raw, "$share/") {
		return raw, nil
	}
	rest := strings.TrimPrefix(raw, "$share/")
	group, filter, ok := strings.Cut(rest, "/")
	if !ok || group == "" || filter == "" {
		return "", fmt.Errorf("shared subscription %q must have the form $share/<group>/<filter>", raw)
	}
	if strings.ContainsAny(group, "+#") {
		return "", fmt.Errorf("shared subscription %q: the group name must not contain '+' or '#'", raw)
	}
	return filter, nil
}

// checkFilter enforces MQTT 3.1.1 §4.7: '#' only as the whole last level,
// '+' only as a whole level, no NUL, valid UTF-8, non-empty, length limit.
func checkFilter(f string) error {
	switch {
	case f == "":
		return errors.New("must not be empty")
	case len(f) > maxFilterBytes:
		return fmt.Errorf("is %d bytes long, at most %d are allowed", len(f), maxFilterBytes)
	case !utf8.ValidString(f):
		return errors.New("is not valid UTF-8")
	case strings.ContainsRune(f, 0):
		return errors.New("must not contain NUL")
	}
	levels := strings.Split(f, "/")
	for i, l := range levels {
		if strings.Contains(l, "#") && (l != "#" || i != len(levels)-1) {
			return errors.New("'#' must be a whole level and the last one (e.g. a/#)")
		}
		if strings.Contains(l, "+") && l != "+" {
			return errors.New("'+' must be a whole level (e.g. a/+/c)")
		}
	}
	return nil
}

// Match returns the configured filter that routes topic: the most specific
// class wins (exact, then '+', then '#'), then declaration order. ok is
// false when no filter matches (a message left over from an old
// subscription of a persistent session).
func (subs Subscriptions) Match(topic string) (sub Subscription, ok bool) {
	levels := strings.Split(topic, "/")
	for _, s := range subs {
		if !matchLevels(s.levels, levels) {
			continue
		}
		if !ok || s.class < sub.class {
			sub, ok = s, true
		}
	}
	return sub, ok
}

// matchLevels matches a split topic against a split filter. A topic starting
// with '$' is not matched by a filter starting with a wildcard (§4.7.2).
func matchLevels(filter, topic []string) bool {
	if len(topic) > 0 && strings.HasPrefix(topic[0], "$") && len(filter) > 0 && (filter[0] == "+" || filter[0] == "#") {
		return false
	}
	for i, f := range filter {
		if f == "#" {
			return true // matches the parent level too: "a/#" matches "a"
		}
		if i >= len(topic) {
			return false
		}
		if f != "+" && f != topic[i] {
			return false
		}
	}
	return len(filter) == len(topic)
}

// BrokerFilters is what the input subscribes to.
func (subs Subscriptions) BrokerFilters(qos byte) map[string]byte {
	m := make(map[string]byte, len(subs))
	for _, s := range subs {
		m[s.Raw] = qos
	}
	return m
}
