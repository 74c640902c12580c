package groupcommit

import (
	"fmt"
	"testing"
	"time"
)

// Requests already waiting are committed together, at most max per group,
// in arrival order; Run returns when closing is closed.
func TestRunGroupsWaitingRequests(t *testing.T) {
	reqs := make(chan int, 10)
	for i := range 10 {
		reqs <- i
	}
	closing := make(chan struct{})
	groups := make(chan []int, 10)
	done := make(chan struct{})
	go func() {
		Run(reqs, closing, 4, func(g []int) { groups <- append([]int(nil), g...) })
		close(done)
	}()
	var got []string
	for range 3 {
		select {
		case g := <-groups:
			got = append(got, fmt.Sprint(g))
		case <-time.After(5 * time.Second):
			t.Fatalf("groups so far %v; the rest did not come within 5s", got)
		}
	}
	if want := "[[0 1 2 3] [4 5 6 7] [8 9]]"; fmt.Sprint(got) != want {
		t.Fatalf("groups %v, want %s", got, want)
	}
	// A lone request is committed at once, not held back for company.
	reqs <- 42
	select {
	case g := <-groups:
		if fmt.Sprint(g) != "[42]" {
			t.Fatalf("lone request committed as %v", g)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a lone request was not committed within 5s")
	}
	close(closing)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return within 5s of closing")
	}
}
